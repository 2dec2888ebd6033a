"""Drift comparison: a live child against the one the operator wants."""

from __future__ import annotations

from chunkpilot.operator.drift import foreign_selector_keys, is_subset


def test_subset_comparison_ignores_server_defaults_but_sees_edits() -> None:
    desired = {"spec": {"replicas": 1, "template": {"containers": [{"name": "e", "args": ["a", "b"]}]}}}
    live = {
        "spec": {
            "replicas": 1,
            "progressDeadlineSeconds": 600,
            "template": {
                "containers": [{"name": "e", "args": ["a", "b"], "imagePullPolicy": "IfNotPresent"}]
            },
        },
        "status": {},
    }
    assert is_subset(desired, live)
    live["spec"]["template"]["containers"][0]["args"] = ["a", "c"]  # type: ignore[index]
    assert not is_subset(desired, live)


def test_foreign_service_selector_keys_are_drift() -> None:
    desired = {"kind": "Service", "spec": {"selector": {"chunkpilot.io/service": "chat"}}}
    edited = {"kind": "Service", "spec": {"selector": {"chunkpilot.io/service": "chat", "x": "y"}}}
    assert foreign_selector_keys(desired, edited) == {"x": None}
    assert foreign_selector_keys(desired, desired) == {}
    assert foreign_selector_keys({"kind": "Deployment"}, edited) == {}

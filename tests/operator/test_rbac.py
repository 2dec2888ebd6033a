"""The chart's rendered RBAC against the inventory of API calls the code makes.

:data:`chunkpilot.operator.apicalls.API_CALLS` lists every call of the operator, the autotuner and
Kopf; the Kubernetes client refuses calls missing from it in the test suite, so a new call fails its
tests until it is declared there. Here every declared call of the enabled features must be allowed
by the rendered (Cluster)Role of each watch mode, and every rule must be needed by some call.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from chunkpilot.engine.probe.kube import PUBLISHER_ROLE_NAME
from chunkpilot.operator.apicalls import API_CALLS, ApiCall, Feature, WatchMode

from chunkpilot.devcluster.components import Binary
from chunkpilot.localrun.chart import by_kind, chart_dir, grants_by_name, render, rules_of

pytestmark = pytest.mark.cluster

OPTIONAL = [feature for feature in Feature if feature is not Feature.CORE]
MODE_VALUES = {
    WatchMode.CLUSTER: ["watch.mode=cluster"],
    WatchMode.NAMESPACED: ["watch.mode=namespaced", "watch.namespaces={a,b}"],
}
COMBINATIONS = [
    frozenset(chosen)
    for size in range(len(OPTIONAL) + 1)
    for chosen in itertools.combinations(OPTIONAL, size)
]


@pytest.fixture(scope="module")
def helm(control_plane_binaries: Any) -> Path:
    path: Path = control_plane_binaries[Binary.HELM]
    return path


def chart() -> Path:
    found = chart_dir()
    assert found is not None, "charts/chunkpilot not found from the installed package"
    return found


def roles(
    helm: Path, mode: WatchMode, features: frozenset[Feature], *, peered: bool = False
) -> list[dict[str, Any]]:
    sets = [
        *MODE_VALUES[mode],
        *(f"{feature.value}={str(feature in features).lower()}" for feature in OPTIONAL),
        f"replicaCount={2 if peered else 1}",
    ]
    documents = render(helm, chart(), sets)
    if mode is WatchMode.CLUSTER:
        assert not by_kind(documents, "Role")
        found = [
            role
            for role in by_kind(documents, "ClusterRole")
            if not any(
                key.startswith("rbac.authorization.k8s.io/aggregate-to-")
                for key in role["metadata"]["labels"]
            )
            and role["metadata"]["name"] != PUBLISHER_ROLE_NAME
        ]  # the operator's, not those added to users' default roles nor the probe's
        assert len(found) == 1
    else:
        assert not by_kind(documents, "ClusterRole")
        found = [r for r in by_kind(documents, "Role") if r["metadata"]["name"] != PUBLISHER_ROLE_NAME]
        assert sorted(role["metadata"]["namespace"] for role in found) == ["a", "b"]
    return found


def needed(mode: WatchMode, features: frozenset[Feature], *, peered: bool = False) -> list[ApiCall]:
    enabled = features | {Feature.CORE}
    return [
        call
        for call in API_CALLS
        if call.feature in enabled and mode in call.modes and (peered or not call.peering)
    ]


@pytest.mark.parametrize("peered", [False, True], ids=["one-replica", "peered"])
@pytest.mark.parametrize("features", COMBINATIONS, ids=lambda f: "+".join(sorted(f)) or "defaults")
@pytest.mark.parametrize("mode", list(WatchMode))
def test_rendered_rules_allow_every_call_and_nothing_else(
    helm: Path, mode: WatchMode, features: frozenset[Feature], peered: bool
) -> None:
    """Every declared call is granted and nothing else: the peering objects only when replicas peer."""
    calls = needed(mode, features, peered=peered)
    for role in roles(helm, mode, features, peered=peered):
        granted = rules_of(role)
        for call in calls:
            missing = call.verbs - granted.get((call.group, call.resource), set())
            where = f"{role['kind']} {role['metadata'].get('namespace', '')}/{role['metadata']['name']}"
            assert not missing, (
                f"{where} lacks {sorted(missing)} on {call.group or 'core'}/{call.resource}, "
                f"needed by {call.by}: {call.why}"
            )
        for (group, resource), verbs in granted.items():
            wanted = set().union(*(c.verbs for c in calls if (c.group, c.resource) == (group, resource)))
            assert verbs <= wanted, (
                f"{role['kind']} grants {sorted(verbs - wanted)} on {group or 'core'}/{resource} "
                "that no declared call needs (chunkpilot.operator.apicalls.API_CALLS)"
            )


@pytest.mark.parametrize("mode", list(WatchMode))
def test_calls_on_named_objects_are_granted_on_those_names_only(helm: Path, mode: WatchMode) -> None:
    """The live-adjustment Secret: get and patch on its one name per namespace, never on every Secret;
    and bind on the probe's publisher role only."""
    named_calls = [call for call in API_CALLS if call.names]
    publisher = frozenset({PUBLISHER_ROLE_NAME})
    assert {(c.resource, c.names) for c in named_calls} == {
        ("secrets", frozenset({"chunkpilot-live-adjust"})),
        ("clusterroles", publisher),
        ("roles", publisher),
    }
    for features in COMBINATIONS:
        calls = needed(mode, features)
        for role in roles(helm, mode, features):
            rules = grants_by_name(role)
            for group, resource in {(c.group, c.resource) for c in calls if c.names}:
                unnamed = set().union(
                    *(c.verbs for c in calls if (c.group, c.resource) == (group, resource) and not c.names)
                )
                for names, verbs in rules[(group, resource)]:
                    assert names or verbs <= unnamed, (features, names, verbs)  # e.g. create only
                for call in (c for c in calls if (c.group, c.resource) == (group, resource) and c.names):
                    covering = set().union(*(v for n, v in rules[(group, resource)] if n and n <= call.names))
                    assert call.verbs <= covering, (features, call)


@pytest.mark.parametrize("mode", list(WatchMode))
def test_secrets_only_with_live_adjustment_and_pods_read_only(helm: Path, mode: WatchMode) -> None:
    for features in COMBINATIONS:
        for role in roles(helm, mode, features):
            granted = rules_of(role)
            assert (("", "secrets") in granted) == (Feature.LIVE_ADJUST in features), (features, granted)
            # Read-only; the router's Role (disaggregation) can only grant get and watch held here.
            pods = {"get", "list", "watch"} if Feature.DISAGGREGATION in features else {"list"}
            assert granted[("", "pods")] == pods


def test_every_declared_feature_is_a_chart_value() -> None:
    values = (chart() / "values.yaml").read_text()
    for feature in OPTIONAL:
        section, key = feature.value.split(".")
        assert f"\n{section}:\n" in values and f"  {key}: false" in values, feature

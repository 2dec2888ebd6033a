"""Every invalid manifest is rejected by the Python model with the message the apiserver gives.

The same files are applied to a real apiserver in test_cluster.py; the expected fragments are
shared, so the CEL rules and their Python mirrors cannot drift apart unnoticed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from chunkpilot.api import CelRule, InferenceService, ManifestError, TuningTrial
from chunkpilot.api.common import ApiModel


def _parse(manifest: dict[str, object]) -> None:
    if manifest["kind"] == "TuningTrial":
        TuningTrial.from_manifest(manifest)
    else:
        InferenceService.from_manifest(manifest)


def _models(cls: type[ApiModel]) -> Iterator[type[ApiModel]]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _models(sub)


ALL_RULES = sorted(
    {rule for model in _models(ApiModel) for rule in model.cel_rules},
    key=lambda rule: rule.rule + rule.message,
)


def test_invalid_manifest_is_rejected_with_the_expected_message(invalid_case: Any) -> None:
    with pytest.raises(ManifestError) as caught:
        _parse(invalid_case.manifest)
    message = str(caught.value)
    for fragment in invalid_case.expects:
        assert fragment.lower() in message.lower(), f"{fragment!r} not in:\n{message}"


def test_there_are_enough_invalid_manifests(all_invalid_cases: list[Any]) -> None:
    assert len(all_invalid_cases) >= 25


def test_every_cel_rule_is_exercised_by_an_invalid_manifest(
    all_invalid_cases: list[Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    broken: set[CelRule] = set()
    original = CelRule.violation

    def recording(self: CelRule, obj: object) -> str | None:
        message = original(self, obj)
        if message is not None:
            broken.add(self)
        return message

    monkeypatch.setattr(CelRule, "violation", recording)
    for case in all_invalid_cases:
        with pytest.raises(ManifestError):
            _parse(case.manifest)
    missing = [rule.rule for rule in ALL_RULES if rule not in broken]
    assert not missing, f"no invalid manifest breaks: {missing}"


@pytest.mark.parametrize("rule", ALL_RULES, ids=[rule.message[:40] for rule in ALL_RULES])
def test_rule_messages_name_a_field_and_a_fix(rule: CelRule) -> None:
    field = rule.field_path.rsplit(".", 1)[-1] if rule.field_path else "metadata.name"
    assert field in rule.message
    assert ":" in rule.message or "requires" in rule.message, "say how to fix it after a colon"


@pytest.mark.parametrize(
    ("extra_args", "valid"),
    [
        (["--additional-config", '{"a": 1}'], True),
        (['--additional-config={"a": {"b": 2}}'], True),
        (["--enforce-eager"], True),
        (["--additional-config", "not json"], False),  # the spaced form: the model checks what CEL cannot
        (["--additional-config", "[1]"], False),
        (["--additional-config"], False),  # no value at all
        (['--additional-config={"a": 1'], False),  # braces, but not JSON
    ],
)
def test_an_additional_config_must_be_a_json_object(extra_args: list[str], valid: bool) -> None:
    manifest = {
        "apiVersion": "chunkpilot.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "chat"},
        "spec": {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}, "engine": {"extraArgs": extra_args}},
    }
    if valid:
        InferenceService.from_manifest(manifest)
        return
    with pytest.raises(ManifestError, match="--additional-config must be a JSON object"):
        InferenceService.from_manifest(manifest)

"""Golden tests: the child manifests rendered for each case under golden/cases/.

Regenerate after an intended change with
``CHUNKPILOT_UPDATE_GOLDEN=1 .venv/bin/pytest tests/operator/test_golden.py`` and review the diff.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from chunkpilot.operator.cli import render_text

GOLDEN = Path(__file__).parent / "golden"
CASES = sorted((GOLDEN / "cases").glob("*.yaml"))
UPDATE = os.environ.get("CHUNKPILOT_UPDATE_GOLDEN") == "1"


class _NoAliases(yaml.SafeDumper):
    def ignore_aliases(self, data: object) -> bool:
        return True


@pytest.mark.parametrize("case", CASES, ids=[case.stem for case in CASES])
def test_rendered_children_match_golden(case: Path) -> None:
    errors, manifests = render_text(
        case.read_text(), pod_monitor=True, pod_monitor_labels={"release": "kube-prometheus-stack"}
    )
    assert errors == []
    rendered = yaml.dump_all(manifests, Dumper=_NoAliases, sort_keys=True)
    golden = GOLDEN / f"{case.stem}.golden.yaml"
    if UPDATE:
        golden.write_text(rendered)
    assert golden.exists(), f"missing {golden.name}: run with CHUNKPILOT_UPDATE_GOLDEN=1"
    assert rendered == golden.read_text(), f"{case.name} renders differently from {golden.name}"


def test_every_golden_file_has_a_case() -> None:
    stems = {case.stem for case in CASES}
    orphans = [
        p.name for p in GOLDEN.glob("*.golden.yaml") if p.name.removesuffix(".golden.yaml") not in stems
    ]
    assert orphans == []


@pytest.mark.cluster
@pytest.mark.parametrize("case", CASES, ids=[case.stem for case in CASES])
def test_rendered_workloads_are_accepted_by_the_apiserver(control_plane: object, case: Path) -> None:
    """The Deployment and Service of every case (every engine kind) pass the real apiserver's validation."""
    import json

    errors, manifests = render_text(case.read_text(), pod_monitor=False, pod_monitor_labels={})
    assert errors == []
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "llm"}}
    kubectl = control_plane.kubectl  # type: ignore[attr-defined]
    kubectl("apply", "-f", "-", input=json.dumps(namespace))
    for manifest in manifests:
        if manifest["kind"] not in ("Deployment", "Service"):
            continue
        manifest["metadata"].pop("ownerReferences", None)  # the owner exists only in a real reconcile
        kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(manifest))

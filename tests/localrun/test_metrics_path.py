"""An engine that does not serve /metrics (TensorRT-LLM: /prometheus/metrics) is scraped where it does:
the operator names the path on the pod, the pod runner carries it into the file_sd target."""

from __future__ import annotations

from pathlib import Path

import yaml
from chunkpilot.operator.builders import ANNOTATION_METRICS_PATH, build_stable_deployment

from chunkpilot.api import InferenceService
from chunkpilot.localrun.endpoints import Endpoint
from chunkpilot.localrun.podspec import METRICS_PATH_ANNOTATION, parse_pod
from chunkpilot.localrun.targets import FileSDTargets, read_targets

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _pod(example: str) -> dict[str, object]:
    isvc = InferenceService.model_validate(yaml.safe_load((EXAMPLES / example).read_text()))
    template = build_stable_deployment(isvc)["spec"]["template"]
    return {**template, "metadata": {**template["metadata"], "name": "p", "namespace": "default"}}


def test_the_pod_names_a_metrics_path_other_than_metrics_and_the_runner_reads_it() -> None:
    assert METRICS_PATH_ANNOTATION == ANNOTATION_METRICS_PATH
    trtllm = parse_pod(_pod("llama-8b-trtllm.yaml"))
    assert trtllm.metrics_path == "/prometheus/metrics"
    for example in ("chat-llama-8b-sim.yaml", "qwen-7b-sglang.yaml"):
        pod = _pod(example)
        assert METRICS_PATH_ANNOTATION not in pod["metadata"]["annotations"]  # type: ignore[index]
        assert parse_pod(pod).metrics_path == "/metrics"


def test_the_file_sd_target_carries_the_path(tmp_path: Path) -> None:
    targets = FileSDTargets(tmp_path / "targets.json")
    trtllm = Endpoint("default", "t", "chat", "canary", "abc", "127.0.0.1", 9001, "", "/prometheus/metrics")
    vllm = Endpoint("default", "v", "chat", "stable", "def", "127.0.0.1", 9002)
    targets.register(trtllm)
    targets.register(vllm)
    assert trtllm.prometheus_labels()["__metrics_path__"] == "/prometheus/metrics"
    assert "__metrics_path__" not in vllm.prometheus_labels()
    assert read_targets(tmp_path / "targets.json") == sorted([trtllm, vllm])

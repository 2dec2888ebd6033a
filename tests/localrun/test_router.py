"""What the pod runner makes of a router pod: its selectors, its workers and its command line."""

from __future__ import annotations

import pytest

from chunkpilot.localrun.podspec import PodSpecError, parse_pod
from chunkpilot.localrun.router import (
    DEFAULT_ROUTER_COMMAND,
    RouterBackends,
    Worker,
    backends_for,
    is_router,
    parse_router_args,
    parse_selector,
    router_command,
    router_missing,
)
from chunkpilot.testing.deployments import router_args

ROUTER_ARGS = router_args("chat", "demo", "cache_aware")


def worker(namespace: str, role: str, port: int, service: str = "chat") -> Worker:
    labels = {"chunkpilot.io/service": service, "chunkpilot.io/role": role}
    return Worker(namespace, labels, f"http://127.0.0.1:{port}")


def test_router_args_give_the_pools_selectors_and_namespace() -> None:
    spec = parse_router_args(ROUTER_ARGS)
    assert spec.disaggregated and spec.namespace == "demo"
    assert spec.prefill == (("chunkpilot.io/role", "prefill"), ("chunkpilot.io/service", "chat"))
    assert spec.decode == (("chunkpilot.io/role", "decode"), ("chunkpilot.io/service", "chat"))


def test_selector_terms_may_share_an_argument_and_must_be_key_value() -> None:
    assert parse_selector(["a=1 b=2", "c="], "--selector") == (("a", "1"), ("b", "2"), ("c", ""))
    with pytest.raises(PodSpecError, match="'a' is not key=value"):
        parse_selector(["a"], "--selector")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--vllm-pd-disaggregation", "--prefill", "http://10.0.0.1", "--decode", "x"], "service-discovery"),
        (["--vllm-pd-disaggregation", "--service-discovery", "--prefill-selector", "a=b"], "decode-selector"),
        (["--service-discovery", "--port", "8000"], "--selector"),
    ],
)
def test_router_args_the_local_stack_cannot_serve_are_refused(args: list[str], message: str) -> None:
    with pytest.raises(PodSpecError, match=message):
        parse_router_args(args)


def test_workers_are_the_ready_engines_each_selector_matches_in_the_namespace() -> None:
    spec = parse_router_args(ROUTER_ARGS)
    workers = [
        worker("demo", "decode", 9003),
        worker("demo", "prefill", 9002),
        worker("demo", "prefill", 9001),
        worker("other", "prefill", 9004),  # another namespace
        worker("demo", "prefill", 9005, service="code"),  # another service
    ]
    backends = backends_for(spec, workers)
    assert backends == RouterBackends(
        prefill=("http://127.0.0.1:9001", "http://127.0.0.1:9002"), decode=("http://127.0.0.1:9003",)
    )
    assert backends.complete(disaggregated=True)
    assert not backends_for(spec, workers[1:]).complete(disaggregated=True)


def test_regular_mode_selects_workers_and_without_a_namespace_watches_all() -> None:
    spec = parse_router_args(["--service-discovery", "--selector", "chunkpilot.io/service=chat"])
    backends = backends_for(spec, [worker("a", "", 9001), worker("b", "", 9002), worker("b", "", 9003, "x")])
    assert backends == RouterBackends(workers=("http://127.0.0.1:9001", "http://127.0.0.1:9002"))
    assert backends.complete(disaggregated=False)


def test_router_command_replaces_discovery_with_static_workers_and_owns_its_ports() -> None:
    backends = RouterBackends(
        prefill=("http://127.0.0.1:9001", "http://127.0.0.1:9002"), decode=("http://d",)
    )
    command = router_command(
        ["vllm-router"], ROUTER_ARGS, host="127.0.0.1", port=7000, metrics_port=7001, backends=backends
    )
    assert command[:4] == ["vllm-router", "--vllm-pd-disaggregation", "--policy", "cache_aware"]
    joined = " ".join(command)
    for gone in ("--service-discovery", "selector", "29000", "0.0.0.0", "--port 8000"):
        assert gone not in joined
    assert "--prefill http://127.0.0.1:9001 --prefill http://127.0.0.1:9002 --decode http://d" in joined
    assert "--host 127.0.0.1 --port 7000 --prometheus-host 127.0.0.1 --prometheus-port 7001" in joined
    assert "--worker-startup-check-interval 1" in joined


def test_a_router_pod_runs_its_router_container_and_probes_its_readiness_path() -> None:
    labels = {"chunkpilot.io/service": "chat", "chunkpilot.io/component": "router"}
    manifest = {
        "metadata": {"name": "chat-router-1", "namespace": "demo", "uid": "u", "labels": labels},
        "spec": {
            "nodeName": "n",
            "containers": [
                {"name": "sidecar", "args": ["x"]},
                {
                    "name": "router",
                    "args": ROUTER_ARGS,
                    "readinessProbe": {"httpGet": {"path": "/readiness", "port": "http"}},
                },
            ],
        },
    }
    pod = parse_pod(manifest)
    assert is_router(labels) and pod.router and pod.container == "router"
    assert pod.args == tuple(ROUTER_ARGS) and pod.health_path == "/readiness" and pod.role == ""


def test_an_engine_pod_carries_its_pool_role_and_the_default_health_path() -> None:
    labels = {"chunkpilot.io/service": "chat", "chunkpilot.io/role": "decode"}
    manifest = {
        "metadata": {"name": "chat-decode-1", "namespace": "demo", "uid": "u", "labels": labels},
        "spec": {"containers": [{"name": "engine", "args": ["llama-3.1-8b"]}]},
    }
    pod = parse_pod(manifest)
    assert pod.role == "decode" and not pod.router and pod.health_path == "/health"
    assert dict(pod.labels) == labels


def test_a_missing_router_installation_is_named_with_the_install_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert router_missing(DEFAULT_ROUTER_COMMAND) is None  # the test extra installs it
    assert router_missing(["/opt/router/bin/vllm-router"]) is None  # a command of one's own: not judged
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    message = router_missing(DEFAULT_ROUTER_COMMAND)
    assert message is not None and "pip install 'chunkpilot[router]'" in message

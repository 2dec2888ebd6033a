"""Spreading requests over Ready endpoints, and the file_sd targets file."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from pathlib import Path

import pytest

from chunkpilot.cli import build_parser
from chunkpilot.localrun.endpoints import (
    DEFAULT_ROUTING,
    Endpoint,
    RandomBalancer,
    RoundRobinBalancer,
    balancer_for,
    static_source,
)
from chunkpilot.localrun.targets import (
    FileSDTargets,
    TargetsFileError,
    read_targets,
    routers_path,
    targets_file_source,
)


def endpoint(pod: str, track: str = "stable", port: int = 8000, service: str = "chat") -> Endpoint:
    return Endpoint("default", pod, service, track, "abc123", "127.0.0.1", port)


def test_round_robin_gives_each_pod_an_equal_share() -> None:
    pods = [
        endpoint("s-1", port=1),
        endpoint("s-2", port=2),
        endpoint("s-3", port=3),
        endpoint("c-1", "canary", 4),
    ]
    balancer = RoundRobinBalancer(static_source(pods))
    picks = Counter(balancer.pick() for _ in range(400))
    assert set(picks.values()) == {100}
    tracks = Counter(e.track for e in picks.elements())
    assert tracks == {"stable": 300, "canary": 100}


def test_round_robin_follows_the_endpoint_set_as_it_changes() -> None:
    current: list[Endpoint] = [endpoint("a", port=1)]
    balancer = RoundRobinBalancer(lambda: current)
    assert balancer.pick() == current[0]
    current.append(endpoint("b", port=2))
    assert {balancer.pick(), balancer.pick()} == set(current)
    current.clear()
    assert balancer.pick() is None


def test_random_split_gives_shares_per_pod_without_a_fixed_rotation() -> None:
    pods = [endpoint(f"s-{port}", port=port) for port in (1, 2, 3)] + [endpoint("c-1", "canary", 4)]
    balancer = RandomBalancer(static_source(pods), seed=7)
    picks = [balancer.pick() for _ in range(4000)]
    tracks = Counter(e.track for e in picks if e is not None)
    assert 900 <= tracks["canary"] <= 1100  # a quarter, within ~5 standard deviations
    # Not a rotation: some pod is picked twice in a row (a rotation never repeats one).
    assert any(a == b for a, b in itertools.pairwise(picks))
    assert RandomBalancer(static_source(pods), seed=7).pick() == picks[0]  # the seed reproduces the split
    assert RandomBalancer(static_source([])).pick() is None


def test_routing_is_named_and_random_by_default_as_kube_proxy() -> None:
    pods = [endpoint(f"s-{port}", port=port) for port in (1, 2)]
    assert DEFAULT_ROUTING == "random"
    assert isinstance(balancer_for(DEFAULT_ROUTING, static_source(pods), seed=3), RandomBalancer)
    rotation = balancer_for("round-robin", static_source(pods))
    assert [rotation.pick() for _ in range(4)] == pods * 2
    with pytest.raises(ValueError, match="use one of random, round-robin"):
        balancer_for("least-loaded", static_source(pods))
    load = build_parser(load=("load",)).parse_args(["load", "--trace", "azure_conv_2023"])
    assert load.routing == DEFAULT_ROUTING
    with pytest.raises(SystemExit):
        build_parser(load=("load",)).parse_args(["load", "--trace", "x", "--routing", "least-loaded"])


def test_targets_file_lists_registered_endpoints_with_their_labels(tmp_path: Path) -> None:
    path = tmp_path / "sd" / "targets.json"
    targets = FileSDTargets(path)
    assert json.loads(path.read_text()) == []
    canary = endpoint("chat-canary-x", "canary", 9001)
    targets.register(endpoint("chat-stable-y", "stable", 9000))
    targets.register(canary)
    document = json.loads(path.read_text())
    assert {"targets": ["127.0.0.1:9001"], "labels": canary.prometheus_labels()} in document
    assert canary.prometheus_labels()["track"] == "canary"
    assert read_targets(path) == targets.endpoints()
    targets.deregister("default", "chat-stable-y")
    assert read_targets(path) == [canary]
    assert targets_file_source(path, "chat") == [canary]
    assert targets_file_source(path, "other") == []
    targets.clear()
    assert read_targets(path) == []


def test_reading_a_missing_or_broken_targets_file(tmp_path: Path) -> None:
    assert read_targets(tmp_path / "absent.json") == []
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(TargetsFileError, match="file_sd"):
        read_targets(broken)
    broken.write_text('[{"targets": ["nohostport"]}]')
    with pytest.raises(TargetsFileError, match="host:port"):
        read_targets(broken)


def test_a_pool_engine_is_listed_with_its_role_and_a_colocated_one_without(tmp_path: Path) -> None:
    path = tmp_path / "targets.json"
    targets = FileSDTargets(path)
    decode = Endpoint("default", "chat-decode-x", "chat", "stable", "abc123", "127.0.0.1", 9002, "decode")
    targets.register(decode)
    targets.register(endpoint("code-stable-y", port=9003, service="code"))
    groups = {group["targets"][0]: group["labels"] for group in json.loads(path.read_text())}
    assert groups["127.0.0.1:9002"]["role"] == "decode"
    assert "role" not in groups["127.0.0.1:9003"]
    assert [e for e in read_targets(path) if e.service == "chat"] == [decode]


def test_a_disaggregated_service_is_reached_through_its_routers_listed_beside_the_targets(
    tmp_path: Path,
) -> None:
    path = tmp_path / "targets.json"
    targets = FileSDTargets(path)
    assert not routers_path(path).exists()
    prefill = Endpoint("default", "chat-prefill-x", "chat", "stable", "abc123", "127.0.0.1", 9001, "prefill")
    targets.register(prefill)
    assert targets_file_source(path, "chat") == []  # no Ready router yet: no endpoint
    router = endpoint("chat-router-z", port=9000)
    targets.register(router, router=True)
    assert routers_path(path) == tmp_path / "targets.routers.json"
    assert read_targets(path) == [prefill]  # Prometheus scrapes the engines only
    assert targets_file_source(path, "chat") == [router]
    targets.deregister("default", "chat-router-z")
    assert read_targets(routers_path(path)) == [] and targets_file_source(path, "chat") == []


def test_a_topology_trials_canary_router_shares_a_colocated_services_traffic_and_its_pools_take_none(
    tmp_path: Path,
) -> None:
    path = tmp_path / "targets.json"
    targets = FileSDTargets(path)
    stable = endpoint("chat-stable-y", port=9000)
    targets.register(stable)
    for role, port in (("prefill", 9001), ("decode", 9002)):
        pool = f"chat-{role}-canary-x"
        targets.register(Endpoint("default", pool, "chat", "canary", "def456", "127.0.0.1", port, role))
    assert targets_file_source(path, "chat") == [stable]  # the canary pools are behind a router only
    router = endpoint("chat-router-canary-z", "canary", port=9003)
    targets.register(router, router=True)
    assert targets_file_source(path, "chat") == sorted([stable, router])


def test_a_colocated_trials_canary_engines_beside_pools_are_reached_through_its_router_only(
    tmp_path: Path,
) -> None:
    path = tmp_path / "targets.json"
    targets = FileSDTargets(path)
    targets.register(
        Endpoint("default", "chat-decode-x", "chat", "stable", "abc123", "127.0.0.1", 9001, "decode")
    )
    canary = endpoint("chat-canary-y", "canary", port=9002)  # colocated: no role
    targets.register(canary)
    stable_router = endpoint("chat-router-z", port=9000)
    canary_router = endpoint("chat-router-canary-z", "canary", port=9003)
    targets.register(stable_router, router=True)
    targets.register(canary_router, router=True)
    assert targets_file_source(path, "chat") == sorted([stable_router, canary_router])

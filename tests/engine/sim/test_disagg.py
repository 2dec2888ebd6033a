"""Prefill/decode disaggregation offline: engine roles in the scheduler, the KV transfer as a timed
event, and the phenomena a P:D topology must show against colocated replicas on as many GPUs."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest
from chunkpilot.engine.sim.disagg import (
    KVTransfer,
    PoolConfig,
    RouterPolicy,
    Topology,
    disaggregated_capacity,
    parse_topology,
    simulate_colocated,
    simulate_disaggregated,
)
from chunkpilot.engine.sim.engine import SimConfig
from chunkpilot.engine.sim.metrics import StepTelemetry
from chunkpilot.engine.sim.offline import SLO, simulate
from chunkpilot.engine.sim.scheduler import Request, RequestStatus, Scheduler, SchedulerConfig
from chunkpilot.engine.sim.workload import RequestSpec, Workload, parse_workload_spec, poisson

from chunkpilot.cli import main

BASE = SimConfig.for_engine("vllm", max_num_batched_tokens=8192, max_num_seqs=256)


def _bimodal(n: int, rate: float, seed: int = 7) -> Workload:
    """Chat (200-token prompts, 256 tokens out) mixed with 25% summarisation (6000 in, 64 out)."""
    rng = random.Random(seed)
    lengths = [(6000, 64) if rng.random() < 0.25 else (200, 256) for _ in range(n)]
    return poisson(lengths, rate, seed=1)


def _one(prompt: int, output: int) -> Workload:
    return Workload("one", (RequestSpec(0.0, prompt, output),))


# ---- the roles inside the scheduler -------------------------------------------------------------
def test_a_prefill_only_request_keeps_its_blocks_until_released() -> None:
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=512, max_num_seqs=8), num_kv_blocks=100)
    sched.check_invariants = True
    request = Request("p", 0.0, 1000, 1)
    request.kv_hold = True
    sched.add_request(request)
    now = 0.0
    while request.status is not RequestStatus.FINISHED:
        output = sched.schedule(now)
        now += 0.01
        sched.update(output, now)
    assert output.num_scheduled_tokens == 1000 - 512  # chunked as configured: 512 then 488
    assert sched.held == {"p": request}
    assert sched.kv.num_free_blocks == 100 - 63  # ceil(1000 / 16) blocks still held
    assert not sched.has_unfinished()
    assert sched.release_held("p")
    assert sched.kv.num_free_blocks == 100
    assert not sched.release_held("p")


def test_a_remote_prefilled_request_holds_blocks_while_its_kv_arrives_then_decodes() -> None:
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=512, max_num_seqs=8), num_kv_blocks=100)
    sched.check_invariants = True
    sched.kv_transfer_s = lambda tokens: tokens * 1e-4  # 0.1 s for 1000 tokens
    request = Request("d", 0.0, 1000, 5)
    request.remote_prefill = True
    sched.add_request(request)
    assert sched.schedule(0.0).is_empty
    assert request.status is RequestStatus.WAITING_FOR_REMOTE_KVS
    assert sched.kv.num_free_blocks == 100 - 63  # the prompt's blocks count as used while receiving
    assert sched.next_kv_ready_s() == pytest.approx(0.1)
    assert sched.schedule(0.05).is_empty
    output = sched.schedule(0.1)
    assert [(i.num_new_tokens, i.num_computed_before) for i in output.scheduled] == [(1, 999)]
    assert sched.received == [request]
    results = sched.update(output, 0.11)
    assert results[0].is_first_token and request.first_token_s == pytest.approx(0.11)
    assert request.num_external_tokens == 1000 and request.num_cached_tokens == 999


def test_a_remote_prefill_waits_for_free_blocks() -> None:
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=512, max_num_seqs=8), num_kv_blocks=70)
    sched.kv_transfer_s = lambda tokens: 0.0
    first, second = Request("a", 0.0, 1000, 5), Request("b", 0.0, 1000, 5)
    for request in (first, second):
        request.remote_prefill = True
        sched.add_request(request)
    output = sched.schedule(0.0)
    assert [i.request for i in output.scheduled] == [first]
    assert second.status is RequestStatus.WAITING and second.held_blocks == 0


def test_a_preempted_request_does_not_block_a_received_one() -> None:
    """Blocks held by a request receiving its KV must not starve it behind a preempted request that
    needs them: like vLLM, the receiving requests go first in the waiting pass."""
    config = SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=8, enable_prefix_caching=False)
    sched = Scheduler(config, num_kv_blocks=10)
    sched.check_invariants = True
    sched.kv_transfer_s = lambda tokens: 1.0
    local, remote = Request("local", 0.0, 80, 60), Request("remote", 0.0, 64, 20)
    remote.remote_prefill = True
    for request in (local, remote):
        sched.add_request(request)
    now, steps = 0.0, 0
    while sched.has_unfinished():
        steps += 1
        assert steps < 2000, "the scheduler stalled"
        output = sched.schedule(now)
        if output.is_empty:
            assert sched.next_kv_ready_s() > now, "nothing runnable and nothing on the way"
            now = sched.next_kv_ready_s()
            continue
        now += 0.01
        sched.update(output, now)
    assert local.num_preemptions >= 1  # it ran out of blocks while the remote KV held 4 of 10
    assert remote.finish_s is not None and local.finish_s is not None
    assert remote.finish_s < local.finish_s


# ---- topology ----------------------------------------------------------------------------------
def test_topology_specs_and_what_cannot_be_disaggregated() -> None:
    assert parse_topology("1P3D") == (1, 3)
    assert parse_topology("2p:2d") == (2, 2)
    for bad in ("3D1P", "0P2D", "1P", "P1D2"):
        with pytest.raises(ValueError, match="--topology"):
            parse_topology(bad)
    topo = Topology.of("1P3D", BASE, decode={"max_num_batched_tokens": 1024, "tensor_parallel_size": 2})
    assert topo.name == "1P3D" and topo.num_gpus == 1 + 3 * 2
    assert topo.decode.config.scheduler.max_num_batched_tokens == 1024
    assert topo.prefill.config.scheduler.max_num_batched_tokens == 8192
    with pytest.raises(ValueError, match="unknown pool setting"):
        Topology.of("1P1D", BASE, prefill={"budget": 1})
    with pytest.raises(ValueError, match="same model"):
        Topology(PoolConfig(BASE), PoolConfig(SimConfig(model="llama-3.1-70b", tensor_parallel_size=4)))
    with pytest.raises(ValueError, match="vLLM"):
        PoolConfig(SimConfig.for_engine("sglang"))
    for bad_link in ({"bandwidth_gbps": 0.0}, {"latency_ms": -1.0}):
        with pytest.raises(ValueError, match="--kv-"):
            KVTransfer(**bad_link)  # type: ignore[arg-type]


def test_one_colocated_replica_behind_the_router_is_the_plain_engine() -> None:
    workload = parse_workload_spec("n=200,rate=10,prompt=100-6000,output=20-300,prefix=512,groups=4")
    config = SimConfig.for_engine("vllm", max_num_batched_tokens=2048, max_num_seqs=64)
    plain = simulate(config, workload, keep_records=True)
    routed = simulate_colocated(config, 1, workload, keep_records=True)
    assert routed.records == plain.records
    assert routed.itl_ms == plain.itl_ms and routed.steps == plain.steps


# ---- the transfer --------------------------------------------------------------------------------
def test_ttft_is_prefill_plus_transfer_plus_one_decode_step_and_grows_as_bandwidth_shrinks() -> None:
    prompt = 4000
    kv_bytes = BASE.build().model.kv_bytes_per_token * prompt
    ttfts = []
    for gbps in (100.0, 10.0, 1.0):
        link = KVTransfer(bandwidth_gbps=gbps, latency_ms=2.0)
        summary = simulate_disaggregated(Topology.of("1P1D", BASE, kv_transfer=link), _one(prompt, 10))
        assert summary.transfer_ms is not None and summary.prefill_ttft_ms is not None
        assert summary.transfer_ms.p50 == pytest.approx(link.seconds(kv_bytes) * 1e3)
        decode_step = summary.ttft_ms.p50 - summary.prefill_ttft_ms.p50 - summary.transfer_ms.p50
        assert 0 < decode_step < 20  # the decode engine computes only the last prompt token
        ttfts.append(summary.ttft_ms.p50)
    assert ttfts[0] < ttfts[1] < ttfts[2]
    assert ttfts[2] - ttfts[0] == pytest.approx(kv_bytes * (1 / 1e9 - 1 / 100e9) * 1e3, rel=1e-6)


def test_blocks_are_held_on_both_sides_longer_on_a_slower_link() -> None:
    workload = _bimodal(120, 4.0)
    fast, slow = (
        simulate_disaggregated(Topology.of("1P1D", BASE, kv_transfer=KVTransfer(gbps)), workload)
        for gbps in (100.0, 0.5)
    )
    for summary in (fast, slow):
        assert summary.pool("prefill").kv_usage_peak > 0 and summary.pool("decode").kv_usage_peak > 0
    # The prefill side keeps each finished prompt's blocks until the decode side has received them,
    # and the decode side counts them as used while they arrive.
    assert slow.pool("prefill").kv_usage_mean > 5 * fast.pool("prefill").kv_usage_mean
    assert slow.pool("decode").kv_usage_mean > fast.pool("decode").kv_usage_mean
    assert slow.kv_bytes_per_request == fast.kv_bytes_per_request > 0


def test_tokens_are_counted_per_role() -> None:
    workload = _bimodal(60, 4.0)
    summary = simulate_disaggregated(Topology.of("1P2D", BASE), workload)
    prefill, decode = summary.pool("prefill"), summary.pool("decode")
    prompts = sum(r.prompt_tokens for r in workload.requests)
    assert prefill.prompt_tokens == decode.prompt_tokens == prompts
    assert prefill.generation_tokens == len(workload.requests)  # one token per prefill request
    assert decode.generation_tokens == sum(r.output_tokens for r in workload.requests)
    assert prefill.requests == decode.requests == len(workload.requests)
    assert prefill.tokens_per_step > 100 * decode.tokens_per_step > 0  # prompts there, decodes here


def test_each_pools_steps_are_recorded_as_its_metrics_would() -> None:
    workload = _bimodal(60, 4.0)
    telemetry = {"prefill": StepTelemetry(), "decode": StepTelemetry()}
    summary = simulate_disaggregated(Topology.of("1P2D", BASE), workload, telemetry=telemetry)
    plain = simulate_disaggregated(Topology.of("1P2D", BASE), workload)
    assert summary.itl_ms == plain.itl_ms and summary.ttft_ms == plain.ttft_ms  # recording changes nothing
    for role in ("prefill", "decode"):
        totals = telemetry[role].totals().values()
        steps = sum(t.steps for t in totals)
        assert steps == summary.pool(role).steps > 0
        assert sum(t.duration_s for t in totals) > 0
    prefilled = sum(t.prefill_tokens for t in telemetry["prefill"].totals().values())
    assert prefilled == sum(r.prompt_tokens for r in workload.requests)
    # The prompts' KV came from the prefill pool: the decode pool computes one token of each.
    assert sum(t.prefill_tokens for t in telemetry["decode"].totals().values()) == len(workload.requests)


@pytest.mark.parametrize("gbps", [0.5, 5.0])
def test_a_prefill_replica_full_of_held_blocks_admits_again_once_they_are_released(gbps: float) -> None:
    # A burst fills the prefill replica's cache with prompts whose KV waits for the decode side;
    # when the decode replica takes them, the freed blocks must let the next prompts in (the
    # replica used to wait for an arrival that never came, its queue stranded).
    small = replace(BASE, num_kv_blocks=600)  # 9,600 tokens: four 2,000-token prompts held at once
    burst = poisson([(2000, 32)] * 40, 200.0, seed=1)
    summary = simulate_disaggregated(
        Topology(PoolConfig(small, 1), PoolConfig(BASE, 1), KVTransfer(gbps, 1.0)), burst
    )
    assert summary.pool("decode").requests == 40 and summary.ttft_ms.p50 > 0


# ---- the phenomena ----------------------------------------------------------------------------------
def test_decode_pool_never_stalls_behind_long_prefills() -> None:
    """Same 4 GPUs, bimodal load: colocated replicas stall their decodes for whole 6000-token
    prefill steps; the decode pool of 1P3D only ever runs decode steps."""
    workload = _bimodal(400, 12.0)
    colocated = simulate_colocated(BASE, 4, workload)
    disaggregated = simulate_disaggregated(Topology.of("1P3D", BASE), workload)
    assert disaggregated.itl_ms.p99 < colocated.itl_ms.p99
    assert disaggregated.itl_ms.max < colocated.itl_ms.max / 5
    assert disaggregated.itl_ms.max < 2 * disaggregated.itl_ms.p50
    # ... and pays for it in TTFT: the prefill pool is one replica, and the KV takes the extra hop.
    assert disaggregated.ttft_ms.p50 > colocated.ttft_ms.p50


def test_round_robin_and_least_loaded_both_serve_everything() -> None:
    workload = _bimodal(80, 6.0)
    for policy in RouterPolicy:
        summary = simulate_disaggregated(Topology.of("2P2D", BASE, router=policy), workload)
        assert summary.completed == 80
        assert all(p.requests > 0 for p in summary.pools)


@pytest.mark.slow
def test_capacity_of_a_topology_shrinks_with_the_link() -> None:
    workload = _bimodal(200, 1.0)
    slo = SLO(itl_ms=20.0, ttft_ms=1500.0)
    fast = disaggregated_capacity(
        Topology.of("1P3D", BASE, kv_transfer=KVTransfer(100.0)), workload, slo, tolerance=0.1
    )
    slow = disaggregated_capacity(
        Topology.of("1P3D", BASE, kv_transfer=KVTransfer(0.5)), workload, slo, tolerance=0.1
    )
    assert fast.feasible and fast.at_capacity is not None and fast.at_capacity.slo_met
    assert slow.capacity_req_s < fast.capacity_req_s


# ---- the command line ---------------------------------------------------------------------------------
WORKLOAD = "n=60,rate=6,prompt=100-5000,output=20-200"


def test_sim_run_with_a_topology(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["sim", "run", "--workload", WORKLOAD, "--topology", "1P2D", "--decode-max-num-batched-tokens",
            "1024", "--decode-max-num-seqs", "128", "--prefill-max-num-batched-tokens", "4096",
            "--kv-bandwidth-gbps", "5", "--kv-latency-ms", "3", "--router-policy", "round_robin",
            "--json"]  # fmt: skip
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["completed"] == 60
    topo = data["topology"]
    assert (topo["topology"], topo["gpus"]) == ("1P2D", 3)
    assert topo["kv_transfer"]["bandwidth_gbps"] == 5.0 and topo["kv_transfer"]["latency_ms"] == 3.0
    assert topo["decode"]["max_num_batched_tokens"] == 1024 and topo["decode"]["max_num_seqs"] == 128
    assert topo["prefill"]["max_num_batched_tokens"] == 4096 and topo["decode"]["router"] == "round_robin"
    assert [p["role"] for p in data["pools"]] == ["prefill", "decode"]
    assert data["transfer_ms"]["p50"] >= 3.0
    assert (
        main(["sim", "run", "--workload", WORKLOAD, "--prefill-replicas", "1", "--decode-replicas", "2"]) == 0
    )
    text = capsys.readouterr().out
    assert text.startswith("1P2D on 3 GPUs, KV link 25 GB/s + 1 ms") and "decode    2 x budget" in text


def test_sim_capacity_with_a_topology_and_colocated_replicas(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["sim", "capacity", "--workload", WORKLOAD, "--requests", "60", "--tolerance", "0.2",
            "--slo-itl-ms", "40", "--slo-ttft-ms", "3000", "--json"]  # fmt: skip
    assert main([*base, "--topology", "1P1D"]) == 0
    disaggregated = json.loads(capsys.readouterr().out)
    assert disaggregated["feasible"] and disaggregated["at_capacity"]["topology"]["topology"] == "1P1D"
    assert main([*base, "--replicas", "2"]) == 0
    colocated = json.loads(capsys.readouterr().out)
    assert colocated["feasible"] and colocated["at_capacity"]["pools"][0]["role"] == "colocated"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--topology", "1P"], "--topology '1P' is not"),
        (["--topology", "1P1D", "--prefill-replicas", "1"], "either --topology"),
        (["--prefill-replicas", "1"], "go together"),
        (["--decode-max-num-seqs", "8"], "need --topology"),
        (["--topology", "1P1D", "--replicas", "2"], "--replicas is for colocated"),
        (["--topology", "1P1D", "--kv-bandwidth-gbps", "-1"], "--kv-bandwidth-gbps must be"),
        (
            ["--topology", "1P1D", "--decode-max-num-batched-tokens", "8", "--decode-max-num-seqs", "16"],
            "must be greater than or equal to",
        ),
        (["--replicas", "0"], "--replicas must be >= 1"),
    ],
)
def test_bad_topology_flags_are_clear_errors(
    capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    assert main(["sim", "run", "--workload", WORKLOAD, *extra]) == 2
    assert message in capsys.readouterr().err


def test_topology_needs_vllm(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "run", "--engine", "sglang", "--workload", WORKLOAD, "--topology", "1P1D"]) == 2
    assert "vLLM" in capsys.readouterr().err

"""What the demo runs: one InferenceService, its SLOs, the replayed workload and the clock.

Pure data and a manifest builder, so the defaults can be unit-tested and printed without a cluster.
The embedded default is a code-completion service (Llama-3.1-8B on a simulated H100) replaying the
Azure LLM inference code trace: long prompts, short answers. At the engine's default token budget
of 8192, a long prompt's prefill lands in one step and stalls every running stream, so the ITL p99
objective is missed; a smaller budget meets it at a modest TTFT cost — the trade the tuner finds.

``engine`` picks the engine kind the service asks for: ``sim`` (the simulator speaking vLLM), or
``sglang`` / ``trtllm`` on the simulator image, which then runs with that engine's flags, scheduling
semantics and metric names. SGLang gets ``enableMixedChunk``: with its default separate prefill passes
the decodes wait for every chunk of a prompt back to back, and no chunk size meets a 50 ms ITL p99 on
this trace (the simulator's p99 grows from about 70 to 140 ms as the chunk shrinks from 8192 to 256).

The replica planner (``spec.scaling``, 1 to ``max_replicas`` stable replicas) advises while the
tuner runs: DESIRED shows how many replicas each promoted configuration needs at the live rate (at
the default budget several, since one replica meets the ITL objective only at a light load), and
nothing acts, so every trial is judged beside the replicas it started with. Once the tuning has
ended the demo turns the planner to Auto and surges the replayed rate to about ``surge_replicas``
replicas' worth of the tuned configuration's capacity for ``surge_s`` seconds, then lets it fall
back: the replicas rise and come back down, and the report plots the rate, the replicas and both
SLO quantiles over the run.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from chunkpilot.api.common import parse_duration
from chunkpilot.api.engines import ENGINES

#: The namespace the demo's service lives in.
DEMO_NAMESPACE = "default"
#: Engine kinds the demo can ask for (the registry's ``demo``; all run on the simulator image locally):
#: the CPU engines first (the simulator, the default), then the engines it simulates.
DEMO_ENGINES = (
    *(e.kind for e in ENGINES.values() if e.demo and not e.gpu),
    *(e.kind for e in ENGINES.values() if e.demo and e.gpu),
)


@dataclass(frozen=True)
class DemoScenario:
    """Everything the demo decides; durations are wall-clock seconds unless named otherwise."""

    name: str = "code-assist"
    model: str = "llama-3.1-8b"
    accelerator: str = "h100"
    trace: str = "azure_code_2023"
    #: Poisson arrivals at this rate (requests per engine-second) with the trace's lengths. At 6 req/s
    #: the half of the load the stable track keeps beside a canary (3 req/s, about 120 requests in a
    #: 40-second window, the 100 a track needs to be judged) still misses ITL at the default budget.
    rate: float = 6.0
    budget: int = 8192
    max_num_seqs: int = 128
    itl_quantile: float = 0.99
    itl_max_ms: float = 50.0
    ttft_quantile: float = 0.95
    ttft_max_ms: float = 1000.0
    replicas: int = 1
    max_trials: int = 8
    trial_window: str = "60s"
    warmup: str = "15s"
    #: Engines run this many times faster than real time (1 = real time). The demo keeps real time:
    #: the engines report latencies and step times in engine time, but Prometheus counts requests in
    #: wall time, so at a scale of X the digital twin sees X times the load the engines serve and
    #: predicts latencies they do not have (at 3x its error was 33-592%).
    time_scale: float = 1.0
    #: Give up (and still write the report) after this long.
    timeout_s: float = 1800.0
    nodes: int = 2
    max_prompt_tokens: int = 7680
    #: ``spec.engine.kind`` of the service (see the module docstring).
    engine: str = "sim"
    #: The planner's ``maxReplicas`` (1: scaling off, the service keeps ``replicas``).
    max_replicas: int = 3
    #: The surge: about this many replicas' worth of the twin's capacity (what the planner sizes
    #: with), never above ``surge_max_factor`` times ``rate`` (every engine shares this machine's CPUs).
    surge_replicas: float = 2.5
    surge_max_factor: float = 4.0
    surge_s: float = 120.0
    #: The surge's rate rises in two steps this far apart (a flash crowd that builds).
    surge_ramp_s: float = 20.0
    #: After the surge, how long the demo waits for the replicas to come back down.
    calm_s: float = 150.0
    #: The planner's scale-down stabilization window (the HPA's default of five minutes, shortened).
    scale_down_window_s: int = 30

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise ValueError("; ".join(problems))

    def problems(self) -> list[str]:
        """Every invalid setting, each naming the option and the fix."""
        found: list[str] = []
        if self.rate <= 0:
            found.append(f"--rate must be > 0 requests per second, got {self.rate:g}")
        if self.time_scale <= 0:
            found.append(f"--time-scale must be > 0 (1 = real time), got {self.time_scale:g}")
        for option, quantile in (
            ("--itl-quantile", self.itl_quantile),
            ("--ttft-quantile", self.ttft_quantile),
        ):
            if not 0 < quantile < 1:
                found.append(f"{option} must be between 0 and 1 (exclusive), e.g. 0.99; got {quantile:g}")
        for option, value in (("--itl-ms", self.itl_max_ms), ("--ttft-ms", self.ttft_max_ms)):
            if value <= 0:
                found.append(f"{option} must be a positive number of milliseconds, got {value:g}")
        if self.max_trials < 1:
            found.append(f"--max-trials must be >= 1, got {self.max_trials}")
        if self.budget < self.max_num_seqs:
            found.append(f"--budget ({self.budget}) must be >= --max-num-seqs ({self.max_num_seqs})")
        try:
            window, warmup = parse_duration(self.trial_window), parse_duration(self.warmup)
        except ValueError as error:
            found.append(f"--trial-window/--warmup: {error}")
        else:
            if warmup >= window:
                found.append(
                    f"--warmup ({self.warmup}) must be shorter than --trial-window ({self.trial_window})"
                )
        if self.timeout_s <= 0:
            found.append(f"--timeout must be > 0 seconds, got {self.timeout_s:g}")
        if self.engine not in DEMO_ENGINES:
            found.append(f"--engine must be one of {', '.join(DEMO_ENGINES)}, got {self.engine!r}")
        if not self.max_replicas >= self.replicas:
            found.append(
                f"--max-replicas ({self.max_replicas}) must be >= the starting replicas ({self.replicas}); "
                "1 turns the replica planner off"
            )
        if not (self.surge_replicas > 0 and self.surge_max_factor >= 1 and self.calm_s >= 0):
            found.append("the surge needs --surge-replicas > 0, a rate factor >= 1 and a calm >= 0 s")
        if not self.surge_s > self.surge_ramp_s >= 0:
            found.append(f"--surge-s must be longer than the surge's ramp ({self.surge_ramp_s:g} s)")
        return found

    @property
    def scales(self) -> bool:
        """Whether the replica planner runs (in Auto) and the demo surges the load."""
        return self.max_replicas > 1

    def surge_rate(self, capacity_req_s: float) -> float:
        """The replayed rate of the surge, given one replica's capacity as the planner sizes with it."""
        return min(self.rate * self.surge_max_factor, max(self.rate, self.surge_replicas * capacity_req_s))

    @property
    def trial_seconds(self) -> float:
        """Wall-clock seconds one trial measures (warm-up included)."""
        return parse_duration(self.trial_window)

    @property
    def warmup_seconds(self) -> float:
        """Wall-clock seconds of warm-up before a trial's window counts."""
        return parse_duration(self.warmup)

    def fast(self) -> DemoScenario:
        """A variant with four shorter trials and a shorter scale-down window: about twelve minutes
        on a laptop (everything runs in real time)."""
        return replace(
            self,
            max_trials=4,
            trial_window="40s",
            warmup="10s",
            timeout_s=1200.0,
            calm_s=120.0,
            scale_down_window_s=20,
        )


def build_inferenceservice(scenario: DemoScenario) -> dict[str, Any]:
    """The InferenceService manifest the demo applies: the simulator engine at the default budget."""
    model: dict[str, Any] = {"name": scenario.model, "servedName": scenario.name, "maxModelLen": 8192}
    if scenario.engine == "trtllm":
        del model["servedName"]  # trtllm-serve names the model by its argument
    return {
        "apiVersion": "chunkpilot.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {
            "name": scenario.name,
            "namespace": DEMO_NAMESPACE,
            "labels": {"app.kubernetes.io/part-of": "chunkpilot-demo"},
        },
        "spec": {
            "model": model,
            "engine": _engine(scenario),
            "resources": {"accelerator": scenario.accelerator},
            "replicas": scenario.replicas,
            "slo": {
                "itl": {"quantile": scenario.itl_quantile, "maxMs": scenario.itl_max_ms},
                "ttft": {"quantile": scenario.ttft_quantile, "maxMs": scenario.ttft_max_ms},
                "window": scenario.trial_window,
            },
            "autotune": {
                "enabled": True,
                "objective": "throughput",
                "trialWindow": scenario.trial_window,
                "warmup": scenario.warmup,
                "maxTrials": scenario.max_trials,
                "canaryReplicas": 1,
            },
            **({"scaling": _scaling(scenario)} if scenario.scales else {}),
        },
    }


def _scaling(scenario: DemoScenario) -> dict[str, Any]:
    return {
        "mode": "Advise",  # the demo turns it to Auto once the tuning has ended
        "minReplicas": scenario.replicas,
        "maxReplicas": scenario.max_replicas,
        "behavior": {"scaleDown": {"stabilizationWindowSeconds": scenario.scale_down_window_s}},
    }


def _engine(scenario: DemoScenario) -> dict[str, Any]:
    engine: dict[str, Any] = {
        "kind": scenario.engine,
        "maxNumBatchedTokens": scenario.budget,
        "maxNumSeqs": scenario.max_num_seqs,
        "enablePrefixCaching": True,
    }
    if scenario.engine == "sim":
        return engine
    from chunkpilot.operator.engines.sim import default_sim_image

    engine["image"] = default_sim_image()  # the simulator stands in for the engine
    if scenario.engine == "sglang":
        engine["enableMixedChunk"] = True
    else:
        engine["enableChunkedPrefill"] = True
    return engine


__all__ = ["DEMO_ENGINES", "DEMO_NAMESPACE", "DemoScenario", "build_inferenceservice"]

"""Counterfactuals on a service's twin: "what latency at rate R on N replicas, with these knobs?".

The twin is fitted as the tuner fits it, from the stable track's telemetry over the SLO window in
Prometheus (:func:`~chunkpilot.tuner.observe.twin.twin_request`), without ranking; then the asked
configuration is simulated at the asked rate split over the asked replicas. Everything is said
with the twin's error on the stable track, measured in the same window.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from chunkpilot.operator.builders import incumbent
from chunkpilot.tuner import records as rec
from chunkpilot.tuner.measure import QueryFn, Selector, VectorFn, measure_track
from chunkpilot.tuner.observe.observer import parse_service
from chunkpilot.tuner.observe.snapshot import Snapshot
from chunkpilot.tuner.observe.twin import sim_slo, twin_request
from chunkpilot.tuner.planner import capacity_of, replicas_for
from chunkpilot.tuner.space import TunedConfig
from chunkpilot.tuner.twin import online
from chunkpilot.tuner.twin.search import planning_capacity

from chunkpilot.api import EngineConfig, Track, parse_duration
from chunkpilot.api.knobs import TUNABLE

__all__ = ["WhatIf", "WhatIfError", "what_if"]


class WhatIfError(ValueError):
    """The question cannot be answered: a bad knob, or no twin to answer it with (says why)."""


@dataclass(frozen=True)
class WhatIf:
    """The twin's answer: quantiles at ``rate_req_s`` over ``replicas``, one replica's capacity at
    SLO, the replicas the rate needs, and the twin's error."""

    service: str
    config: TunedConfig
    rate_req_s: float
    replicas: int
    itl_ms: float
    ttft_ms: float
    #: None: no rate the capacity search tried breaks the SLOs (``unbounded`` says so).
    capacity_req_s: float | None
    needed: int
    error: float
    itl_target: str
    ttft_target: str
    steps: float
    unbounded: str = ""
    #: The capacity should the latencies be as much longer as the twin's error: what is planned with.
    capacity_low_req_s: float | None = None

    def text(self) -> str:
        error = online.fit_error_text(self.error)
        return "\n".join(
            (
                f"{self.service}: {self.rate_req_s:g} req/s over {self.replicas} replica(s) "
                f"({self.rate_req_s / self.replicas:.3g} each) with {self.config.summary()}",
                f"  predicted {self.itl_target}: {self.itl_ms:.1f} ms",
                f"  predicted {self.ttft_target}: {self.ttft_ms:.1f} ms",
                (
                    f"  one replica's capacity at SLO: {self.capacity_req_s:.3g} req/s sustained, "
                    f"{self.capacity_low_req_s or 0:.3g} with the twin's error; "
                    f"{self.needed} replica(s) serve {self.rate_req_s:g} req/s"
                    if self.capacity_req_s is not None
                    else f"  one replica's capacity at SLO: not bounded ({self.unbounded})"
                ),
                f"  the twin's error on the stable track: {error} (fitted on {self.steps:,.0f} engine steps)",
            )
        )


def with_knobs(config: TunedConfig, settings: Mapping[str, str]) -> TunedConfig:
    """``config`` with ``settings`` (``maxNumBatchedTokens=4096``, …: the knob table's API names)."""
    by_name = {knob.camel: knob.name for knob in TUNABLE}
    changes: dict[str, int | None] = {}
    for name, value in settings.items():
        field = by_name.get(name)
        if field is None:
            raise WhatIfError(f"unknown knob {name!r}: one of {', '.join(sorted(by_name))}")
        try:
            changes[field] = int(value) if value.lower() not in ("", "none", "unset") else None
        except ValueError:
            raise WhatIfError(f"{name}={value!r}: a whole number is needed") from None
    try:
        return rec.tuned_config(EngineConfig.model_validate({**config.as_dict(), **changes}))
    except ValueError as error:
        raise WhatIfError(f"the knobs are not a valid config: {error}") from None


def what_if(
    body: Mapping[str, object],
    query: QueryFn,
    vector: VectorFn,
    at: datetime,
    *,
    rate_req_s: float,
    replicas: int | None = None,
    settings: Mapping[str, str] | None = None,
) -> WhatIf:
    """Fit the service's twin on its telemetry up to ``at`` and answer for ``rate_req_s`` over
    ``replicas`` (default: the replicas it runs) with its stable knobs changed by ``settings``."""
    if not rate_req_s > 0:
        raise WhatIfError(f"--rate must be above 0 req/s, not {rate_req_s:g}")
    isvc = parse_service(dict(body))
    if isvc is None or isvc.status is None:
        raise WhatIfError("the InferenceService could not be read as one")
    slo_spec = isvc.spec.slo
    if slo_spec is None:
        raise WhatIfError("the service declares no slo: the twin predicts against SLO targets")
    count = replicas if replicas is not None else isvc.running_replicas()
    if count < 1:
        raise WhatIfError(f"--replicas must be at least 1, not {count}")
    snap = Snapshot(body, isvc, isvc.status, (), at, incumbent(isvc))
    selector = Selector(snap.name, snap.namespace, Track.STABLE, config_hash=snap.incumbent.config_hash())
    slo = snap.slo
    engine = str(isvc.spec.engine.kind)
    stable = measure_track(query, selector, slo_spec.window, at, slo.itl_quantile, slo.ttft_quantile, engine)
    live = stable.per_replica(stable.offered_rate)
    inputs = online.read_inputs(
        vector,
        selector,
        slo_spec.window,
        float(parse_duration(slo_spec.window)),
        at,
        (slo.itl_quantile, slo.ttft_quantile),
        (stable.itl_samples, stable.ttft_samples),
        engine=engine,
        steadiness=False,
        segments=True,
    )
    waiting = (
        online.waiting_reason(inputs) if inputs.exported else "the stable engine exports no step telemetry"
    )
    if waiting is not None or inputs.workload is None or live is None:
        raise WhatIfError(f"no twin to ask: {waiting or 'no live request rate in the SLO window'}")
    calibration = online.calibrate(twin_request(snap, inputs, "whatif", live, rank=False))
    config = with_knobs(rec.tuned_config(snap.incumbent), settings or {})
    max_model_len = rec.service_facts(isvc).max_model_len
    itl, ttft = online.predict_ms(
        calibration.twin, config, rate_req_s / count, sim_slo(snap), max_model_len, calibration.offset_ms
    )
    slo_steps = online.offset_slo(sim_slo(snap), calibration.offset_ms)
    capacity_req_s: float | None = None
    low: float | None = None
    try:
        capacity_req_s, low = planning_capacity(
            calibration.twin.for_planning(), config, slo_steps, calibration.error, max_model_len=max_model_len
        )
    except ValueError as error:  # no rate the search tried breaks the SLOs: the window's load is light
        unbounded = str(error)
    else:
        unbounded = ""
    needed = count
    if capacity_req_s is not None:
        capacity = capacity_of(capacity_req_s, calibration.error, low_req_s=low)
        needed = replicas_for(rate_req_s, capacity) or count
    return WhatIf(
        service=f"{snap.namespace}/{snap.name}",
        config=config,
        rate_req_s=rate_req_s,
        replicas=count,
        itl_ms=itl,
        ttft_ms=ttft,
        capacity_req_s=capacity_req_s,
        capacity_low_req_s=low,
        needed=needed,
        unbounded=unbounded,
        error=calibration.error,
        itl_target=f"ITL p{slo.itl_quantile * 100:g} (target {slo.itl_ms:g} ms)",
        ttft_target=f"TTFT p{slo.ttft_quantile * 100:g} (target {slo.ttft_ms:g} ms)",
        steps=calibration.fit.steps,
    )

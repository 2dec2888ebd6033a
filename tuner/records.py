"""Pure translations between the API objects and the tuner's internal values.

InferenceService -> service facts, SLO targets, abort rules, search-space bounds;
TuningTrial -> study record; measurements -> printer-column strings and conditions.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import fields
from datetime import datetime
from typing import Final

from chunkpilot.operator.builders import incumbent
from chunkpilot.operator.engines import EngineRender, render_engine
from chunkpilot.tuner.policy import AbortRules, SLOTargets
from chunkpilot.tuner.space import Knob, SearchSpace, ServiceFacts, TunedConfig
from chunkpilot.tuner.study import RecordState, TrialRecord, relative_constraints

from chunkpilot.api import (
    EngineConfig,
    InferenceService,
    InferenceServiceSpec,
    Measurement,
    Objective,
    SLOState,
    TokenMix,
    TopologySpec,
    TrialPhase,
    TrialProgress,
    TrialVerdict,
    TuningTrial,
    knobs,
)

GROUP_PREFIX = "chunkpilot.io"
#: On canary Deployments: the trial they belong to (a fact about the Deployment, kept on it).
ANNOTATION_TRIAL = f"{GROUP_PREFIX}/trial"
#: Tuning round of a trial (a re-tune after a sustained SLO violation starts a new round).
LABEL_ROUND = f"{GROUP_PREFIX}/tuning-round"

#: Where releases before ``status.progress`` kept each progress field (read for trials they wrote).
LEGACY_PROGRESS_ANNOTATIONS: Final = {
    "ready_at": f"{GROUP_PREFIX}/canary-ready-at",
    "measure_from": f"{GROUP_PREFIX}/measure-from",
    "metrics_gap_since": f"{GROUP_PREFIX}/metrics-gap-since",
    "stable_objective": f"{GROUP_PREFIX}/stable-objective",
    "promotion_applied": f"{GROUP_PREFIX}/promotion-applied",
    "live_adjusted": f"{GROUP_PREFIX}/live-adjusted",
    "canary_config_hash": f"{GROUP_PREFIX}/canary-config-hash",
}
#: The same for the spec fields ``studyParams`` and ``tokenMix`` (note and JSON means).
LEGACY_STUDY_PARAMS: Final = f"{GROUP_PREFIX}/study-params"
LEGACY_TOKEN_MIX: Final = f"{GROUP_PREFIX}/token-mix"
LEGACY_TOKEN_MIX_MEANS: Final = f"{GROUP_PREFIX}/token-mix-means"
#: Prefix of a legacy live-adjusted annotation recording a failure.
LEGACY_FAILED_PREFIX: Final = "failed: "

ACTIVE_PHASES = (TrialPhase.PENDING, TrialPhase.ROLLING_OUT, TrialPhase.MEASURING)


# --------------------------------------------------------------------------- service


def slo_targets(isvc: InferenceService) -> SLOTargets:
    """The service's SLO (the API requires one when autotuning)."""
    slo = isvc.spec.slo
    if slo is None:
        raise ValueError("spec.slo is required for autotuning: declare the itl and ttft targets")
    return SLOTargets(
        itl_ms=slo.itl.max_ms,
        ttft_ms=slo.ttft.max_ms,
        itl_quantile=slo.itl.quantile,
        ttft_quantile=slo.ttft.quantile,
    )


def abort_rules(isvc: InferenceService) -> AbortRules:
    abort = isvc.spec.autotune.abort
    return AbortRules(
        itl_factor=abort.itl_factor, ttft_factor=abort.ttft_factor, min_samples=abort.min_samples
    )


def objective_kind(isvc: InferenceService) -> Objective:
    return Objective(str(isvc.spec.autotune.objective))


def tuned_config(config: EngineConfig) -> TunedConfig:
    """The tuner's view of an API EngineConfig."""
    return TunedConfig(**{f.name: getattr(config, f.name) for f in fields(TunedConfig)})


def engine_config(config: TunedConfig) -> EngineConfig:
    """The API EngineConfig of a tuner configuration (validated)."""
    return EngineConfig.model_validate(config.as_dict())


def service_facts(isvc: InferenceService) -> ServiceFacts:
    """Hardware, model, engine and SLO facts the search space is derived from."""
    spec = isvc.spec
    slo = slo_targets(isvc)
    return ServiceFacts(
        accelerator=str(spec.resources.accelerator),
        model=spec.model.name,
        incumbent=tuned_config(incumbent(isvc)),
        itl_target_ms=slo.itl_ms,
        itl_quantile=slo.itl_quantile,
        max_model_len=spec.model.max_model_len or 8192,
        tensor_parallel_size=spec.engine.tensor_parallel_size,
        speculative_tokens=spec.engine.speculative.num_speculative_tokens if spec.engine.speculative else 0,
        engine_kind=str(spec.engine.kind),
        engine_version=spec.engine.version,
        enable_chunked_prefill=spec.engine.enable_chunked_prefill,
        gpu_memory_utilization=spec.engine.gpu_memory_utilization,
        max_prefill_tokens=spec.engine.max_prefill_tokens,
        partial_prefills=renders_partial_prefills(spec),
    )


def renders_partial_prefills(spec: InferenceServiceSpec) -> bool:
    """Whether the operator can render partial-prefill limits for this engine (kind, version, image)."""
    engine = spec.engine.model_copy(update={"max_num_partial_prefills": 2, "max_long_partial_prefills": 1})
    return isinstance(render_engine(spec.model_copy(update={"engine": engine})), EngineRender)


def space_bounds(isvc: InferenceService) -> dict[str, tuple[int, int]]:
    """Bounds overrides from ``spec.autotune.bounds`` keyed by knob name."""
    bounds = isvc.spec.autotune.bounds
    if bounds is None:
        return {}
    result: dict[str, tuple[int, int]] = {}
    for knob in Knob:
        value = getattr(bounds, knob.value, None)
        if value is not None:
            result[knob.value] = (value.min, value.max)
    return result


# --------------------------------------------------------------------------- trials


def trial_phase(trial: TuningTrial) -> TrialPhase:
    return trial.status.phase if trial.status is not None and trial.status.phase else TrialPhase.PENDING


def is_active(trial: TuningTrial) -> bool:
    return trial_phase(trial) in ACTIVE_PHASES


def describe_topology(topology: TopologySpec) -> str:
    """``1 prefill + 1 decode (prefill maxNumBatchedTokens 4096, decode maxNumSeqs 128)``."""
    prefill, decode = topology.prefill, topology.decode
    if prefill is None or decode is None:
        return "no pools"
    return (
        f"{prefill.replicas} prefill + {decode.replicas} decode (prefill maxNumBatchedTokens "
        f"{prefill.max_num_batched_tokens}, decode maxNumSeqs {decode.max_num_seqs})"
    )


def trial_label(trial: TuningTrial) -> str:
    """What a trial tries, in short: a colocated config's knobs, a topology trial's pools, or the
    colocated replicas a service that runs pools tries again (``2 colocated x budget=512 seqs=64``)."""
    topology = trial.spec.topology
    if topology is None:
        return trial.spec.params.summary()
    if trial.spec.tries_colocated:
        return f"{trial.spec.replicas} colocated x {trial.spec.params.summary()}"
    return describe_topology(topology)


def trial_round(trial: TuningTrial) -> int:
    try:
        return int(trial.metadata.labels.get(LABEL_ROUND, "0"))
    except ValueError:
        return 0


def study_params(trial: TuningTrial, space: SearchSpace) -> dict[str, int] | None:
    """The trial's Optuna parameters: the recorded raw ones, else derived from its config."""
    if trial.spec.study_params is not None:
        return dict(trial.spec.study_params)
    raw = trial.metadata.annotations.get(LEGACY_STUDY_PARAMS)
    if raw:
        try:
            data = json.loads(raw)
            return {str(k): int(v) for k, v in data.items()}
        except (ValueError, TypeError, AttributeError):
            pass
    return space.to_params(tuned_config(trial.spec.params))


def trial_record(trial: TuningTrial, space: SearchSpace, slo: SLOTargets) -> TrialRecord | None:
    """The study's view of a finished trial; None for an unfinished one, a topology trial (not a
    point of the colocated space) or one outside the space."""
    if is_active(trial) or trial.spec.is_topology:
        return None
    params = study_params(trial, space)
    if params is None:
        return None
    status = trial.status
    canary = status.canary if status is not None else None
    measured = (
        status is not None
        and status.verdict is not TrialVerdict.ABORTED
        and status.objective is not None
        and canary is not None
        and canary.itl_ms is not None
        and canary.ttft_ms is not None
    )
    if not measured:
        return TrialRecord(number=trial.spec.number, params=params, state=RecordState.FAILED)
    assert (
        status is not None and canary is not None and canary.itl_ms is not None and canary.ttft_ms is not None
    )
    assert status.objective is not None
    return TrialRecord(
        number=trial.spec.number,
        params=params,
        state=RecordState.COMPLETE,
        objective=float(status.objective),
        constraints=relative_constraints({"itl": canary.itl_ms, "ttft": canary.ttft_ms}, slo.as_dict()),
    )


def incumbent_record(
    trials: Sequence[TuningTrial], space: SearchSpace, config: EngineConfig, slo: SLOTargets
) -> TrialRecord | None:
    """The incumbent as a known point of the study, from the latest stable measurement of a trial window."""
    params = space.to_params(tuned_config(config))
    if params is None:
        return None
    config_hash = config.config_hash()
    for trial in sorted(trials, key=lambda t: t.spec.number, reverse=True):
        status = trial.status
        objective = trial_progress(trial).stable_objective
        if (
            status is None
            or status.stable is None
            or objective is None
            or trial.spec.baseline_config_hash != config_hash
        ):
            continue
        stable = status.stable
        if stable.itl_ms is None or stable.ttft_ms is None:
            continue
        if not math.isfinite(objective):
            continue
        return TrialRecord(
            number=-1,
            params=params,
            state=RecordState.COMPLETE,
            objective=objective,
            constraints=relative_constraints({"itl": stable.itl_ms, "ttft": stable.ttft_ms}, slo.as_dict()),
        )
    return None


def config_change(old: EngineConfig, new: EngineConfig) -> str:
    """The knobs that differ (:func:`knobs.change`), e.g. ``maxNumSeqs 256 -> 128``, or ``no change``."""
    return knobs.change(old.model_dump(), new.model_dump()) or "no change"


# --------------------------------------------------------------------------- status strings


def latency_summary(measured_ms: float | None, target_ms: float) -> str:
    """``43/50ms``, or ``-/50ms`` without data."""
    value = "-" if measured_ms is None else f"{measured_ms:.0f}"
    return f"{value}/{target_ms:g}ms"


def slo_state(measurement: Measurement | None, slo: SLOTargets, enough: bool) -> SLOState:
    if measurement is None or not enough or measurement.itl_ms is None or measurement.ttft_ms is None:
        return SLOState.UNKNOWN
    if measurement.itl_ms <= slo.itl_ms and measurement.ttft_ms <= slo.ttft_ms:
        return SLOState.MET
    return SLOState.VIOLATED


def _annotation_time(annotations: Mapping[str, str], key: str) -> datetime | None:
    raw = annotations.get(key)
    if not raw:
        return None
    try:
        return datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return None


# --------------------------------------------------------------------------- progress


def trial_progress(trial: TuningTrial) -> TrialProgress:
    """The trial's progress block; for a trial written before it existed, read from its annotations.

    Once the tuner wrote ``status.progress`` the block is authoritative (a cleared field
    stays cleared); before that the ``chunkpilot.io/*`` annotations of the earlier release
    are its values, so a trial that release started resumes where it was.
    """
    if trial.status is not None and trial.status.progress is not None:
        return trial.status.progress
    annotations = trial.metadata.annotations or {}
    keys = LEGACY_PROGRESS_ANNOTATIONS
    objective: float | None = None
    try:
        raw_objective = annotations.get(keys["stable_objective"])
        objective = float(raw_objective) if raw_objective else None
    except ValueError:
        objective = None
    live = annotations.get(keys["live_adjusted"])
    failed = live is not None and live.startswith(LEGACY_FAILED_PREFIX)
    canary_hash = annotations.get(keys["canary_config_hash"]) or None
    return TrialProgress(
        ready_at=_annotation_time(annotations, keys["ready_at"]),
        measure_from=_annotation_time(annotations, keys["measure_from"]),
        metrics_gap_since=_annotation_time(annotations, keys["metrics_gap_since"]),
        live_adjusted=None if live is None else not failed,
        live_adjust_error=live.removeprefix(LEGACY_FAILED_PREFIX) if failed and live else None,
        canary_config_hash=canary_hash,
        stable_objective=objective,
        promotion_applied=True if annotations.get(keys["promotion_applied"]) else None,
    )


def progress_patch(progress: TrialProgress) -> dict[str, object]:
    """A merge patch writing the whole progress block (a cleared field is written as null)."""
    return {"status": {"progress": progress.model_dump(mode="json", by_alias=True)}}


def canary_config_hash(trial: TuningTrial) -> str:
    """The config hash of the pods serving ``trial`` (their start-up config's, when live-adjusted)."""
    return trial_progress(trial).canary_config_hash or trial.spec.params.config_hash()


def token_mix(trial: TuningTrial) -> TokenMix | None:
    """The token mix the trial's warm start was sized for (``spec.tokenMix``, else the legacy annotations)."""
    if trial.spec.token_mix is not None:
        return trial.spec.token_mix
    annotations = trial.metadata.annotations or {}
    raw, note = annotations.get(LEGACY_TOKEN_MIX_MEANS), annotations.get(LEGACY_TOKEN_MIX)
    if raw is None or note is None:
        return None
    try:
        means = json.loads(raw)
        return TokenMix(prompt=means.get("prompt"), output=means.get("output"), note=note)
    except (ValueError, AttributeError):
        return None

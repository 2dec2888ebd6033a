"""TuningTrials: one in any phase, a finished one whose canary missed the SLOs, and edits of either."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from chunkpilot import api
from chunkpilot.api import EngineConfig, Measurement, TopologySpec, TrialPhase, TrialVerdict, TuningTrial
from chunkpilot.testing.services import NOW, a_manifest
from chunkpilot.tuner.records import LABEL_ROUND

#: The config a trial tries unless told.
TRIAL_CONFIG = EngineConfig(max_num_batched_tokens=1024, max_num_seqs=64)
#: When a trial started unless told: half a minute before :data:`NOW`.
STARTED = NOW - timedelta(seconds=30)


def a_trial(
    number: int = 1,
    phase: TrialPhase | None = TrialPhase.MEASURING,
    *,
    params: EngineConfig = TRIAL_CONFIG,
    service: str = "chat",
    namespace: str = "default",
    round_: int | None = 0,
    window: str | None = "60s",
    topology: TopologySpec | None = None,
    replicas: int | None = None,
    started_at: datetime | None = STARTED,
    **status: Any,
) -> TuningTrial:
    """Trial ``number`` of ``service`` trying ``params`` (and ``topology``; colocated: on ``replicas``)
    over ``window``.

    Labelled with its tuning round unless ``round_`` is None; ``window`` None keeps the CRD's default.
    Its status is None without a ``phase``, else that phase, ``started_at`` and the ``status`` fields.
    """
    labels = api.trial_labels(service, number)
    if round_ is not None:
        labels[LABEL_ROUND] = str(round_)
    spec: dict[str, Any] = {} if window is None else {"window": window}
    return TuningTrial(
        metadata=api.ObjectMeta(name=api.trial_name(service, number), namespace=namespace, labels=labels),
        spec=api.TuningTrialSpec(
            service_name=service, number=number, params=params, topology=topology, replicas=replicas, **spec
        ),
        status=None if phase is None else api.TuningTrialStatus(phase=phase, started_at=started_at, **status),
    )


def a_trial_manifest(
    service: str,
    number: int,
    budget: int,
    status: Mapping[str, Any] | None = None,
    *,
    namespace: str = "default",
    max_num_seqs: int = 128,
) -> dict[str, Any]:
    """Trial ``number`` of ``service`` trying ``budget`` tokens a step (and ``max_num_seqs``) as the API
    server returns it, with ``status`` (none unless given)."""
    spec = {
        "serviceName": service,
        "number": number,
        "params": {"maxNumBatchedTokens": budget, "maxNumSeqs": max_num_seqs},
    }
    fields = {} if status is None else {"status": dict(status)}
    return a_manifest(api.trial_name(service, number), namespace, spec, kind=api.TRIAL_KIND, **fields)


def a_canary(itl_ms: float, ttft_ms: float, samples: int = 500) -> Measurement:
    """A trial's canary measurement: ITL p99 and TTFT p95 (ms) over ``samples`` requests."""
    return Measurement(itl_ms=itl_ms, itl_quantile=0.99, ttft_ms=ttft_ms, ttft_quantile=0.95, samples=samples)


def a_missed_trial(
    number: int,
    budget: int,
    itl_ms: float,
    ttft_ms: float,
    *,
    max_num_seqs: int = 128,
    objective: float = 100.0,
    ran: timedelta | None = None,
    **fields: Any,
) -> TuningTrial:
    """Colocated trial ``number`` of ``budget`` tokens, rolled back and discarded: its canary missed.

    It finished ``29 - number`` minutes before :data:`NOW` (trials in order), having started ``ran``
    before (None: no start recorded); ``fields`` go to :func:`a_trial` and win.
    """
    finished = NOW - timedelta(minutes=29 - number)
    values: dict[str, Any] = {
        "started_at": None if ran is None else finished - ran,
        "finished_at": finished,
        **fields,
    }
    return a_trial(
        number,
        TrialPhase.ROLLED_BACK,
        params=EngineConfig(max_num_batched_tokens=budget, max_num_seqs=max_num_seqs),
        verdict=TrialVerdict.DISCARDED,
        canary=a_canary(itl_ms, ttft_ms),
        objective=objective,
        **values,
    )


def missed_trials(
    rows: Iterable[tuple[int, float, float]], ran: timedelta | None = None
) -> tuple[TuningTrial, ...]:
    """Trials 1, 2, … of :func:`a_missed_trial`, one a ``(budget, itl_ms, ttft_ms)`` row, each run ``ran``."""
    return tuple(a_missed_trial(n, *row, ran=ran) for n, row in enumerate(rows, start=1))


def with_status(trial: TuningTrial, **fields: Any) -> TuningTrial:
    """``trial`` with ``fields`` of its status replaced (it must have a status)."""
    if trial.status is None:
        raise ValueError(f"{trial.metadata.name} has no status")
    return trial.model_copy(update={"status": trial.status.model_copy(update=fields)})

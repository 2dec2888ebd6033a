"""Mirror each service's study into an Optuna RDB storage, so ``optuna-dashboard URL`` can open it.

The tuner's history lives in ``TuningTrial`` objects; this mirror is a read-only copy for
humans. It is enabled by an SQLAlchemy URL in ``CHUNKPILOT_OPTUNA_STORAGE`` (operator flag
``--optuna-storage``, chart value ``optuna.storage``; read at start-up into the tuner's settings,
:attr:`chunkpilot.tuner.config.TunerConfig.optuna_storage`, and passed to each call as ``url``), e.g.
``postgresql+psycopg://user:password@host:5432/optuna`` (install the ``dashboard`` extra for
the driver).

- one study per service, named ``<namespace>/<name>``, direction ``maximize``;
- one Optuna trial per finished tuner trial, with its parameters, objective value, SLO
  constraints (``measured / target - 1``; <= 0 met; ITL then TTFT, shown by the dashboard) and state
  (``COMPLETE`` or ``FAIL``); the tuner's trial number and each constraint are user attributes;
- idempotent: trials already mirrored (matched by the tuner's trial number) are skipped, so
  mirroring the whole history again after an operator restart adds no duplicates;
- never in the way: every failure is logged and swallowed; tuning goes on without it.

The call after each finished trial is :func:`mirror_trials` with the whole history (which also
catches up after a storage outage); it blocks on the database, so async code runs it in a
thread (``asyncio.to_thread``, as the tuner's handlers do).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Iterable, Mapping
from typing import Any

import optuna
from chunkpilot.tuner.space import SearchSpace
from chunkpilot.tuner.study import RecordState, TrialRecord
from optuna.distributions import BaseDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState, create_trial

logger = logging.getLogger(__name__)

#: User attribute holding the tuner's trial number (the key that makes mirroring idempotent).
NUMBER_ATTR = "chunkpilot_trial"
#: Order of the constraint values in each mirrored trial (the study records it as ``constraint_names``).
CONSTRAINT_ORDER = ("itl", "ttft")
#: Seconds to wait for a database connection before giving up on this mirror attempt.
CONNECT_TIMEOUT_S = 5

_storages: dict[str, optuna.storages.RDBStorage] = {}
_lock = threading.Lock()


def study_name(namespace: str, name: str) -> str:
    """The mirrored study's name for one InferenceService."""
    return f"{namespace}/{name}"


def redact(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for log lines)."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    credentials, _, host = rest.rpartition("@")
    user = credentials.split(":", 1)[0]
    return f"{scheme}://{user}{':***' if ':' in credentials else ''}@{host}"


def _engine_kwargs(url: str) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"pool_pre_ping": True}
    if url.startswith(("postgresql", "postgres")):
        kwargs["connect_args"] = {"connect_timeout": CONNECT_TIMEOUT_S}
    return kwargs


def storage(url: str) -> optuna.storages.RDBStorage:
    """The RDB storage for ``url`` (created once per process; tables created on first use)."""
    with _lock:
        found = _storages.get(url)
        if found is None:
            found = optuna.storages.RDBStorage(url, engine_kwargs=_engine_kwargs(url))
            _storages[url] = found
        return found


def _distributions(space: SearchSpace, params: Mapping[str, int]) -> dict[str, BaseDistribution]:
    """The space's distributions, widened where a value lies outside (bounds may have changed)."""
    out: dict[str, BaseDistribution] = {}
    current = space.distributions()
    for key, value in params.items():
        dist = current.get(key)
        if isinstance(dist, IntDistribution):
            low, high = min(dist.low, value), max(dist.high, value)
            out[key] = IntDistribution(low, high, log=dist.log and low >= 1)
        else:
            out[key] = IntDistribution(value, value)
    return out


def frozen_trial(
    space: SearchSpace, record: TrialRecord, attrs: Mapping[str, Any] | None = None
) -> FrozenTrial:
    """The Optuna trial mirroring one finished tuner trial."""
    params = {k: int(v) for k, v in record.params.items()}
    constraints = {k: float(v) for k, v in record.constraints.items() if math.isfinite(v)}
    user_attrs: dict[str, Any] = {
        NUMBER_ATTR: record.number,
        "feasible": record.feasible,
        **{f"constraint_{k}": v for k, v in constraints.items()},
        **(attrs or {}),
    }
    complete = (
        record.state is RecordState.COMPLETE
        and record.objective is not None
        and math.isfinite(record.objective)
    )
    # optuna-dashboard reads the list form of the constraints (system attribute "constraints"),
    # in the order of CONSTRAINT_ORDER; the names are user attributes.
    ordered = sorted(constraints, key=_constraint_rank)
    system_attrs = {"constraints": [constraints[k] for k in ordered]} if complete and ordered else {}
    return create_trial(
        state=TrialState.COMPLETE if complete else TrialState.FAIL,
        value=float(record.objective) if complete and record.objective is not None else None,
        params=params,
        distributions=_distributions(space, params),
        user_attrs=user_attrs,
        system_attrs=system_attrs,
    )


def _constraint_rank(key: str) -> tuple[int, str]:
    return (CONSTRAINT_ORDER.index(key) if key in CONSTRAINT_ORDER else len(CONSTRAINT_ORDER), key)


def mirror_trials(
    namespace: str,
    name: str,
    space: SearchSpace,
    records: Iterable[TrialRecord],
    *,
    url: str | None = None,
    attrs: Mapping[int, Mapping[str, Any]] | None = None,
    study_attrs: Mapping[str, Any] | None = None,
) -> int | None:
    """Copy the finished trials not yet in the storage; the number added, or None when it failed.

    ``url``: the storage (the tuner's settings; nothing happens without one); ``attrs``
    maps a trial number to extra user attributes (verdict, measured quantiles, ...);
    ``study_attrs`` are set on the study. Never raises: failures are logged.
    """
    if not url:
        return 0
    try:
        return _mirror(namespace, name, space, list(records), url, attrs or {}, study_attrs or {})
    except Exception as error:  # the mirror must never break tuning
        logger.warning(
            "optuna mirror of %s to %s failed (tuning continues): %s",
            study_name(namespace, name),
            redact(url),
            error,
        )
        return None


def _mirror(
    namespace: str,
    name: str,
    space: SearchSpace,
    records: list[TrialRecord],
    url: str,
    attrs: Mapping[int, Mapping[str, Any]],
    study_attrs: Mapping[str, Any],
) -> int:
    study = optuna.create_study(
        storage=storage(url),
        study_name=study_name(namespace, name),
        direction="maximize",
        load_if_exists=True,
    )
    wanted = {"namespace": namespace, "name": name, "constraint_names": list(CONSTRAINT_ORDER), **study_attrs}
    for key, value in wanted.items():
        if study.user_attrs.get(key) != value:
            study.set_user_attr(key, value)
    present = {t.user_attrs.get(NUMBER_ATTR) for t in study.get_trials(deepcopy=False)}
    added = 0
    for record in sorted(records, key=lambda r: r.number):
        if record.number in present:
            continue
        study.add_trial(frozen_trial(space, record, attrs.get(record.number)))
        present.add(record.number)
        added += 1
    return added

"""The InferenceService as the operator serves it, given what its status records.

The promoted engine config and topology are read from the tuner-written status
(``status.bestConfig``, ``status.bestTopology``); the ``LiveAdjust`` condition says when the
installation withholds the live adjustment the service asks for. Pure functions.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar

from chunkpilot.operator.builders import effective_topology
from chunkpilot.operator.config import (
    LIVE_ADJUST_DISABLED_MESSAGE,
    REASON_LIVE_ADJUST_DISABLED,
)
from chunkpilot.operator.status import check_owner, set_condition
from pydantic import BaseModel

from chunkpilot.api import (
    ConditionOwner,
    ConditionStatus,
    ConditionType,
    EngineConfig,
    InferenceService,
    InferenceServiceStatus,
    ScalingStatus,
    TopologySpec,
)

logger = logging.getLogger(__name__)
_Model = TypeVar("_Model", bound=BaseModel)


def _recorded(isvc: InferenceService, raw_status: Any, field: str, model: type[_Model]) -> _Model | None:
    """``status.<field>`` of the raw status as ``model``; None when absent, or invalid (logged)."""
    recorded = raw_status.get(field) if isinstance(raw_status, Mapping) else None
    if not recorded:
        return None
    try:
        return model.model_validate(recorded)
    except ValueError:
        logger.warning("ignoring invalid status.%s of %s: %r", field, isvc.metadata.name, recorded)
        return None


def with_best_config(isvc: InferenceService, raw_status: Any) -> InferenceService:
    """``isvc`` with ``status.bestConfig`` taken from the raw status; an invalid one is ignored.

    The rest of ``isvc.status`` is kept (e.g. a ``bestTopology`` read first).
    """
    config = _recorded(isvc, raw_status, "bestConfig", EngineConfig)
    if config is None:
        return isvc
    status = (isvc.status or InferenceServiceStatus()).model_copy(update={"best_config": config})
    return isvc.model_copy(update={"status": status})


def with_scaling(isvc: InferenceService, raw_status: Any) -> InferenceService:
    """``isvc`` with the planner's decision (``status.scaling``) taken from the raw status, so that it
    runs :meth:`~chunkpilot.api.InferenceService.running_replicas`; an invalid one is ignored."""
    scaling = _recorded(isvc, raw_status, "scaling", ScalingStatus)
    if scaling is None:
        return isvc
    status = (isvc.status or InferenceServiceStatus()).model_copy(update={"scaling": scaling})
    return isvc.model_copy(update={"status": status})


def with_best_topology(isvc: InferenceService, raw_status: Any) -> InferenceService:
    """``isvc`` running the topology a topology trial promoted (``status.bestTopology``), if it runs one.

    See :func:`~chunkpilot.operator.builders.promoted_topology`; an invalid one is ignored.
    """
    topology = _recorded(isvc, raw_status, "bestTopology", TopologySpec)
    if topology is None:
        return isvc
    status = (isvc.status or InferenceServiceStatus()).model_copy(update={"best_topology": topology})
    return effective_topology(isvc.model_copy(update={"status": status}))


def with_live_adjust_condition(
    status: InferenceServiceStatus, blocked: bool, generation: int, now: datetime | None = None
) -> InferenceServiceStatus:
    """``status`` with the ``LiveAdjust`` condition: False (``LiveAdjustDisabled``) while blocked, else none.

    Blocked: the service asks for ``autotune.liveAdjust`` and the installation disables it
    (:attr:`OperatorConfig.live_adjust`); its engines then serve no live-adjustment route.
    """
    check_owner(ConditionType.LIVE_ADJUST, ConditionOwner.OPERATOR)
    if blocked:
        now = now or datetime.now(UTC).replace(microsecond=0)
        status.conditions = set_condition(
            status.conditions,
            ConditionType.LIVE_ADJUST,
            ConditionStatus.FALSE,
            REASON_LIVE_ADJUST_DISABLED,
            LIVE_ADJUST_DISABLED_MESSAGE,
            generation,
            now,
        )
    else:
        status.conditions = [c for c in status.conditions if c.type != ConditionType.LIVE_ADJUST]
    return status

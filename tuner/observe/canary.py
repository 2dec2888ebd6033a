"""What the canary Deployment says about itself: the trial that owns it, whether it is parked,
the config its pods were started with, the live-adjustment token, and which pods are Ready.

A canary belongs to the trial named in its ``chunkpilot.io/trial`` annotation; a *parked* one
(``chunkpilot.io/parked``) is kept between trials for the next one to adjust. Both annotations, and
the start-up config in ``chunkpilot.io/config``, describe the Deployment itself (who uses it, what its
pods were started with), so they stay on it rather than on a trial. Pure readers: no I/O here.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

from chunkpilot.operator.builders import (
    ANNOTATION_CONFIG,
)
from chunkpilot.tuner import records as rec

from chunkpilot.api import (
    EngineConfig,
    InferenceService,
    knobs,
)

#: The knobs the route can change (the knob table's ``live`` column); every other knob needs a restart.
LIVE_KNOBS: Final = knobs.LIVE_NAMES

#: On the canary Deployment: kept between trials for the next one to adjust ("true").
ANNOTATION_PARKED: Final = f"{rec.GROUP_PREFIX}/parked"


def started_config(deployment: Mapping[str, Any] | None) -> EngineConfig | None:
    """The config a canary Deployment's pods were started with (None: not recorded or unreadable)."""
    raw = _annotations(deployment).get(ANNOTATION_CONFIG)
    if not raw:
        return None
    try:
        return EngineConfig.model_validate(json.loads(raw))
    except ValueError:
        return None


def secret_token(secret: Mapping[str, Any] | None, key: str) -> str | None:
    """The bearer token under ``key`` in the live-adjustment Secret (``data`` or ``stringData``)."""
    if secret is None:
        return None
    encoded = (secret.get("data") or {}).get(key)
    if encoded:
        try:
            return base64.b64decode(encoded).decode() or None
        except (ValueError, UnicodeDecodeError):
            return None
    plain = (secret.get("stringData") or {}).get(key)
    return str(plain) if plain else None


def controller_uid(obj: Mapping[str, Any]) -> str | None:
    """The uid of the object's controller (its ownerReference with ``controller: true``)."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("uid")) if ref.get("uid") else None
    return None


def owned_through(
    pods: Sequence[Mapping[str, Any]], replica_sets: Sequence[Mapping[str, Any]], deployment_uid: str
) -> tuple[Mapping[str, Any], ...]:
    """The ``pods`` controlled by a ReplicaSet that the Deployment of ``deployment_uid`` controls.

    Labels say which pods look like the canary's; uids say which are. A pod of someone else's with
    the canary's labels never gets the token.
    """
    sets = {
        str((rs.get("metadata") or {}).get("uid"))
        for rs in replica_sets
        if controller_uid(rs) == deployment_uid
    }
    return tuple(pod for pod in pods if controller_uid(pod) in sets)


def pod_ready(pod: Mapping[str, Any]) -> bool:
    """Running, Ready and not being deleted."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _annotations(deployment: Mapping[str, Any] | None) -> Mapping[str, str]:
    return ((deployment or {}).get("metadata") or {}).get("annotations") or {}


def canary_owner(canary: Mapping[str, Any] | None) -> str | None:
    """The trial a canary Deployment belongs to (None: none, or no canary)."""
    return _annotations(canary).get(rec.ANNOTATION_TRIAL) or None


def is_parked(canary: Mapping[str, Any] | None) -> bool:
    """Kept between trials for the next one to adjust."""
    return bool(_annotations(canary).get(ANNOTATION_PARKED))


def is_terminating(canary: Mapping[str, Any] | None) -> bool:
    """Being deleted."""
    return bool(((canary or {}).get("metadata") or {}).get("deletionTimestamp"))


def enabled(isvc: InferenceService) -> bool:
    """``autotune.liveAdjust`` is on and the installation allows it (the chart's ``liveAdjust.enabled``).

    Without the chart value the operator holds no Secrets: it renders no route and sets the
    ``LiveAdjustDisabled`` condition, and the tuner rolls every trial out instead. The service is
    the one the observer read (:func:`~chunkpilot.tuner.observe.observer.parse_service`), with the
    installation's switch (the tuner's settings) applied: live adjustment off when it is.
    """
    return isvc.spec.autotune.live_adjust

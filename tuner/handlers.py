"""Kopf handlers of the autotuner: one timer per InferenceService drives :class:`TuningController`.

Loaded by the operator (``chunkpilot.operator.main``) when this module exists.  Kopf
facts that shape it: a timer keeps no memory between runs and restarts with the
operator, so each tick re-reads everything from the cluster; the tuner writes
status itself (nothing goes through Kopf's ``patch``, which a long-running
handler would only apply on return).

Environment:

- ``CHUNKPILOT_PROMETHEUS_URL`` (``--prometheus-url``): where the engines' metrics are;
  without it the tuner only reports ``MetricsUnavailable``.
- ``CHUNKPILOT_TUNER_INTERVAL``: seconds between ticks (default 10).
- ``CHUNKPILOT_TUNER_ROLLOUT_TIMEOUT``: seconds a canary may take to become Ready (default 900).
- ``CHUNKPILOT_TWIN_CPU_SECONDS``: CPU seconds one ranking on the digital twin may spend (default 30),
  in a worker process off the event loop.
- ``CHUNKPILOT_TWIN_MAX_EVALUATIONS``: evaluations one ranking may make as well (unset: the CPU
  seconds alone end it); a count ends it alike on a busy machine and a quiet one.
- ``CHUNKPILOT_TWIN``: ``off`` tunes without the digital twin (on measurements alone); default ``on``.
- ``CHUNKPILOT_OPTUNA_STORAGE`` (``--optuna-storage``): an Optuna RDB the finished trials are
  mirrored into after each trial (:mod:`chunkpilot.tuner.act.mirror`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import kopf
from chunkpilot.operator.config import OperatorConfig
from chunkpilot.operator.events import post_event
from chunkpilot.operator.kube import KubeClient
from chunkpilot.tuner.act import mirror
from chunkpilot.tuner.act.live_adjust import HttpLiveAdjuster, pod_ip_endpoint, targets_file_resolver
from chunkpilot.tuner.controller import Mirror, TunerSettings, TuningController
from chunkpilot.tuner.measure import PrometheusClient
from chunkpilot.tuner.space import SearchSpace
from chunkpilot.tuner.study import TrialRecord

from chunkpilot.api import GROUP, ISVC_PLURAL, VERSION

logger = logging.getLogger(__name__)

ENV_INTERVAL = "CHUNKPILOT_TUNER_INTERVAL"
ENV_ROLLOUT_TIMEOUT = "CHUNKPILOT_TUNER_ROLLOUT_TIMEOUT"
#: A Prometheus file_sd file naming each engine pod's address (the local pod runner writes one);
#: unset: live adjustment calls pods at their pod IP.
ENV_POD_TARGETS = "CHUNKPILOT_POD_TARGETS_FILE"
#: ``off`` runs the tuner without the digital twin (tuning on measurements alone); default ``on``.
ENV_TWIN = "CHUNKPILOT_TWIN"
FIELD_MANAGER = "chunkpilot-tuner"
MEMO_KEY = "tuner"


def _float_env(name: str, default: float) -> float:
    text = os.environ.get(name, "")
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{name}={text!r} is not a number of seconds") from None
    if value <= 0:
        raise ValueError(f"{name}={text!r} must be greater than zero")
    return value


INTERVAL_S = _float_env(ENV_INTERVAL, 10.0)


def twin_enabled() -> bool:
    """Whether ``CHUNKPILOT_TWIN`` (``on`` or ``off``, default ``on``) lets the tuner use the twin."""
    text = os.environ.get(ENV_TWIN, "on").strip().lower()
    if text not in ("on", "off"):
        raise ValueError(f"{ENV_TWIN}={text!r}: use on or off")
    return text == "on"


def _mirror_to(url: str) -> Mirror:
    async def copy(
        namespace: str,
        name: str,
        space: SearchSpace,
        records: list[TrialRecord],
        attrs: Mapping[int, Mapping[str, Any]],
    ) -> int | None:
        return await mirror.amirror_trials(namespace, name, space, records, url=url, attrs=attrs)

    return copy


def _tuning_wanted(spec: kopf.Spec, status: kopf.Status, **_: Any) -> bool:
    """Tick for services that autotune, and for those with a trial left to clean up."""
    autotune = spec.get("autotune") or {}
    return bool(autotune.get("enabled")) or bool(status.get("currentTrial"))


@kopf.on.startup()
async def start_tuner(memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    """Create the tuning controller (its own API client and Prometheus client)."""
    config: OperatorConfig = memo.get("config") or OperatorConfig.from_env()
    try:
        settings = TunerSettings(
            rollout_timeout_s=_float_env(ENV_ROLLOUT_TIMEOUT, 900.0), disaggregation=config.disaggregation
        )
        twin = twin_enabled()
    except ValueError as error:
        raise kopf.PermanentError(str(error)) from None
    prometheus = PrometheusClient(config.prometheus_url, timeout_s=5.0) if config.prometheus_url else None
    kube = KubeClient.from_environment(field_manager=FIELD_MANAGER)
    url = mirror.storage_url()
    targets = os.environ.get(ENV_POD_TARGETS)
    resolver = targets_file_resolver(targets) if targets else pod_ip_endpoint
    memo[MEMO_KEY] = TuningController(
        kube,
        prometheus.query if prometheus else None,
        vector=prometheus.vector if prometheus and twin else None,
        post_event=post_event,
        settings=settings,
        mirror=_mirror_to(url) if url else None,
        live_adjuster=HttpLiveAdjuster(resolver),
    )
    logger.info(
        "autotuner ready: Prometheus %s, tick every %gs, digital twin %s",
        config.prometheus_url or "not configured",
        INTERVAL_S,
        "on" if twin else f"off ({ENV_TWIN}=off)",
    )


@kopf.on.cleanup()
async def stop_tuner(memo: kopf.Memo, **_: Any) -> None:
    controller: TuningController | None = memo.get(MEMO_KEY)
    if controller is not None:
        controller.observer.twins.close()
    if controller is not None and isinstance(controller.kube, KubeClient):
        await controller.kube.close()


@kopf.timer(GROUP, VERSION, ISVC_PLURAL, interval=INTERVAL_S, backoff=INTERVAL_S, when=_tuning_wanted)
async def tune(name: str | None, namespace: str | None, memo: kopf.Memo, **_: Any) -> None:
    """One step of the service's tuning loop."""
    controller: TuningController | None = memo.get(MEMO_KEY)
    if controller is None or name is None or namespace is None:
        return
    await controller.step(namespace, name)

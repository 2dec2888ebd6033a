"""Kopf handlers of the autotuner: one timer per InferenceService drives :class:`TuningController`.

Loaded by the operator at start-up (:func:`chunkpilot.operator.startup.load` calls :func:`load`)
when this module exists. Kopf facts that shape it: a timer keeps no memory between runs and
restarts with the operator, so each tick re-reads everything from the cluster; the tuner writes
status itself (nothing goes through Kopf's ``patch``, which a long-running handler would only apply
on return).

Settings (:class:`~chunkpilot.tuner.config.TunerConfig`, read from the operator's environment once,
by :func:`load`, and handed to :func:`start_tuner` through Kopf's memo):

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
- ``CHUNKPILOT_POD_TARGETS_FILE``: a Prometheus file_sd file naming each engine pod's address
  (the local pod runner writes one); unset: live adjustment calls pods at their pod IP.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any, Final

import kopf
from chunkpilot.operator.config import HANDLED_ANNOTATION, OperatorConfig, redacted_url
from chunkpilot.operator.events import post_event
from chunkpilot.operator.handlers import CHILD_LABELS
from chunkpilot.operator.kube import KubeClient
from chunkpilot.tuner.act import mirror
from chunkpilot.tuner.act.live_adjust import HttpLiveAdjuster, pod_ip_endpoint, targets_file_resolver
from chunkpilot.tuner.config import ENV_TWIN, TunerConfig
from chunkpilot.tuner.controller import Mirror, TuningController
from chunkpilot.tuner.measure import PrometheusClient
from chunkpilot.tuner.observe.twinjobs import TwinJobs
from chunkpilot.tuner.observe.watched import LISTED, index_by_label, index_object
from chunkpilot.tuner.space import SearchSpace
from chunkpilot.tuner.study import TrialRecord
from chunkpilot.tuner.twin.jobs import COMPONENT as TWIN_COMPONENT
from chunkpilot.tuner.twin.jobs import LABEL_COMPONENT as TWIN_LABEL_COMPONENT
from chunkpilot.tuner.twin.jobs import OffloadMode

from chunkpilot import telemetry
from chunkpilot.api import GROUP, ISVC_PLURAL, TRIAL_PLURAL, VERSION

logger = logging.getLogger(__name__)

FIELD_MANAGER: Final = "chunkpilot-tuner"
#: Memo key of the :class:`TuningController`.
MEMO_KEY: Final = "tuner"
#: The Kopf indices of the objects the tick reads, by plural (:mod:`chunkpilot.tuner.observe.watched`).
INDICES: Final[Mapping[str, str]] = {
    "deployments": "tuner_deployments",
    ISVC_PLURAL: "tuner_services",
    TRIAL_PLURAL: "tuner_trials",
    "jobs": "tuner_twin_jobs",
}
#: Memo key of the tuner's :class:`TunerConfig`.
MEMO_CONFIG: Final = "tuner_config"

_timer_registered = False


def load(operator: OperatorConfig, environ: Mapping[str, str], memo: kopf.Memo) -> TunerConfig:
    """Read the tuner's settings from ``environ`` (once, at start-up), register the tick at their
    interval and hand the settings to :func:`start_tuner` through ``memo``.

    ``operator``: the operator's configuration of this process (the values the two share). Raises
    :class:`ValueError` naming the variable of a value it cannot use.
    """
    config = TunerConfig.from_env(environ, operator)
    register_timer(config.interval_s, twin_jobs=twin_jobs_run(config))
    memo[MEMO_CONFIG] = config
    return config


def twin_jobs_run(config: TunerConfig) -> bool:
    """Whether rankings may run as Jobs (an image to run them with, and not ``CHUNKPILOT_TWIN_JOBS=off``)."""
    return bool(config.twin_job_image) and config.twin_offload.mode is not OffloadMode.OFF


def register_timer(interval_s: float, *, twin_jobs: bool = False) -> None:
    """Register :func:`tune` as a Kopf timer ticking every ``interval_s`` seconds (once per process);
    with ``twin_jobs``, the ranking Jobs' index too (their progress read from the watch)."""
    global _timer_registered
    if _timer_registered:
        return
    _timer_registered = True
    # Kopf fills its indices from the first listing before it starts any handler or timer.
    kopf.index("apps", "v1", "deployments", labels=CHILD_LABELS, id=INDICES["deployments"])(_index)
    if twin_jobs:
        labels = {TWIN_LABEL_COMPONENT: TWIN_COMPONENT}
        kopf.index("batch", "v1", "jobs", labels=labels, id=INDICES["jobs"])(_index)
    kopf.index(GROUP, VERSION, ISVC_PLURAL, id=INDICES[ISVC_PLURAL])(_index)
    kopf.index(GROUP, VERSION, TRIAL_PLURAL, id=INDICES[TRIAL_PLURAL])(_index_trial)
    kopf.timer(
        GROUP, VERSION, ISVC_PLURAL, id="tune", interval=interval_s, backoff=interval_s, when=_tuning_wanted
    )(tune)


def _index(body: kopf.Body, **_: Any) -> dict[tuple[str, str], dict[str, Any]]:
    return index_object(body)


def _index_trial(body: kopf.Body, **_: Any) -> dict[tuple[str, str], dict[str, Any]]:
    return index_by_label(body, LISTED[TRIAL_PLURAL])


def _mirror_to(url: str) -> Mirror:
    async def copy(
        namespace: str,
        name: str,
        space: SearchSpace,
        records: list[TrialRecord],
        attrs: Mapping[int, Mapping[str, Any]],
    ) -> int | None:
        # The mirror blocks on the database: off the event loop.
        return await asyncio.to_thread(
            mirror.mirror_trials, namespace, name, space, records, url=url, attrs=attrs
        )

    return copy


def _tuning_wanted(spec: kopf.Spec, status: kopf.Status, annotations: kopf.Annotations, **_: Any) -> bool:
    """Tick for services that autotune, and for those with a trial left to clean up; none before the
    operator has handled its creation: reconciled it and recorded so (there is nothing to measure
    before, and the tick's status write would race the operator's and Kopf's writes: the status
    write is conditional, so the loser reads the service and writes again)."""
    if status.get("observedGeneration") is None or HANDLED_ANNOTATION not in annotations:
        return False
    autotune = spec.get("autotune") or {}
    return bool(autotune.get("enabled")) or bool(status.get("currentTrial"))


def controller_for(config: TunerConfig, kube: KubeClient) -> TuningController:
    """The tuning controller ``config`` describes, on ``kube`` (with its own Prometheus client)."""
    prometheus = (
        PrometheusClient(config.prometheus_url, timeout_s=5.0, auth=config.prometheus_auth)
        if config.prometheus_url
        else None
    )
    targets = config.pod_targets_file
    job_image = config.twin_job_image if twin_jobs_run(config) else None
    return TuningController(
        kube,
        prometheus.query if prometheus else None,
        vector=prometheus.vector if prometheus and config.twin else None,
        batch=prometheus.vector if prometheus else None,
        post_event=post_event,
        settings=config.settings,
        mirror=_mirror_to(config.optuna_storage) if config.optuna_storage else None,
        live_adjuster=HttpLiveAdjuster(targets_file_resolver(targets) if targets else pod_ip_endpoint),
        live_adjust=config.live_adjust,
        image_registry=config.image_registry,
        twin_budget=config.twin_budget,
        twin_jobs=TwinJobs(kube, job_image, config.twin_offload) if job_image else None,
    )


@kopf.on.startup()
async def start_tuner(memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    """Create the tuning controller (its own API client and Prometheus client) from the settings."""
    config: TunerConfig = memo[MEMO_CONFIG]
    operator: OperatorConfig = memo["config"]
    kube = KubeClient.from_environment(
        field_manager=FIELD_MANAGER,
        kubeconfig=operator.kubeconfig,
        enforce_declared_calls=operator.enforce_kube_calls,
    )
    memo[MEMO_KEY] = controller_for(config, kube)
    logger.info(
        "autotuner ready: Prometheus %s (%s), tick every %gs, digital twin %s",
        redacted_url(config.prometheus_url) if config.prometheus_url else "not configured",
        config.prometheus_auth.describe(),
        config.interval_s,
        "on" if config.twin else f"off ({ENV_TWIN}=off)",
    )


@kopf.on.cleanup()
async def stop_tuner(memo: kopf.Memo, **_: Any) -> None:
    controller: TuningController | None = memo.get(MEMO_KEY)
    if controller is not None:
        controller.observer.twins.close()
    if controller is not None and isinstance(controller.kube, KubeClient):
        await controller.kube.close()


async def tune(name: str | None, namespace: str | None, memo: kopf.Memo, **kwargs: Any) -> None:
    """One step of the service's tuning loop (a timer, :func:`register_timer`)."""
    controller: TuningController | None = memo.get(MEMO_KEY)
    if controller is None or name is None or namespace is None:
        return
    controller.watched.indices = {
        plural: kwargs[index] for plural, index in INDICES.items() if index in kwargs
    }
    with telemetry.TUNER_TICK_SECONDS.time():
        await controller.step(namespace, name)

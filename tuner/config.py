"""The autotuner's settings: read from the environment once, at the operator's start-up, then passed down.

:meth:`TunerConfig.from_env` is the one place the tuner reads its variables; the operator's start-up
(:func:`chunkpilot.operator.startup.load`) calls it through :func:`chunkpilot.tuner.handlers.load`
with the mapping the operator's own configuration was read from, and hands the frozen result to the
tuner's startup handler through Kopf's memo. The handlers pass each value down as an argument (the
twin's budgets to the :class:`~chunkpilot.tuner.observe.twin.TwinObserver`, the storage URL to the
study mirror, the decide-time limits as :class:`~chunkpilot.tuner.decide.lifecycle.TunerSettings`).

The values the tuner shares with the operator (``--prometheus-url``, ``--optuna-storage`` and the
installation's ``CHUNKPILOT_LIVE_ADJUST`` and ``CHUNKPILOT_DISAGGREGATION`` switches) come from the
operator's :class:`~chunkpilot.operator.config.OperatorConfig`, where a flag overrides its variable.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from chunkpilot.operator.config import OperatorConfig, PrometheusAuth
from chunkpilot.tuner.decide.lifecycle import TunerSettings
from chunkpilot.tuner.twin.jobs import Offload, OffloadMode
from chunkpilot.tuner.twin.online import DEFAULT_CPU_SECONDS, TwinBudget

#: Seconds between the tuner's ticks per service (default 10).
ENV_INTERVAL: Final = "CHUNKPILOT_TUNER_INTERVAL"
#: Seconds a canary may take to become Ready before its trial is aborted (default 900).
ENV_ROLLOUT_TIMEOUT: Final = "CHUNKPILOT_TUNER_ROLLOUT_TIMEOUT"
#: A Prometheus file_sd file naming each engine pod's address (the local pod runner writes one);
#: unset: live adjustment calls pods at their pod IP.
ENV_POD_TARGETS: Final = "CHUNKPILOT_POD_TARGETS_FILE"
#: ``off`` runs the tuner without the digital twin (tuning on measurements alone); default ``on``.
ENV_TWIN: Final = "CHUNKPILOT_TWIN"
#: CPU seconds one ranking on the twin may spend (one tick of one service; default 30).
ENV_TWIN_CPU_SECONDS: Final = "CHUNKPILOT_TWIN_CPU_SECONDS"
#: Evaluations one ranking may make as well (unset: the CPU seconds alone end it). A count ends the
#: search alike on a busy and a quiet machine.
ENV_TWIN_MAX_EVALUATIONS: Final = "CHUNKPILOT_TWIN_MAX_EVALUATIONS"
#: Where rankings on the twin run: ``off`` (default) all in the operator's worker process, ``auto``
#: there within :data:`ENV_TWIN_LOCAL_CORES` and as Kubernetes Jobs beyond, ``always`` as Jobs.
ENV_TWIN_JOBS: Final = "CHUNKPILOT_TWIN_JOBS"
#: Cores the operator's own twin work may use on average over ten minutes (default 0.5; ``auto``).
ENV_TWIN_LOCAL_CORES: Final = "CHUNKPILOT_TWIN_LOCAL_CORES"
#: The twin Jobs' image: the operator's own (required unless ``CHUNKPILOT_TWIN_JOBS=off``).
ENV_TWIN_JOB_IMAGE: Final = "CHUNKPILOT_TWIN_JOB_IMAGE"

DEFAULT_INTERVAL_S: Final = 10.0
DEFAULT_ROLLOUT_TIMEOUT_S: Final = 900.0


@dataclass(frozen=True)
class TunerConfig:
    """Everything the autotuner's handlers need to know beyond the objects they read."""

    #: Where the engines' metrics are (``--prometheus-url``); None: the tuner only reports
    #: ``MetricsUnavailable``.
    prometheus_url: str | None = None
    #: Its credentials (``prometheus.auth`` chart values: files mounted from Secrets).
    prometheus_auth: PrometheusAuth = field(default_factory=PrometheusAuth)
    #: The Optuna RDB the finished trials are mirrored into (``--optuna-storage``); None: no mirror.
    optuna_storage: str | None = None
    #: The installation allows ``autotune.liveAdjust`` (``CHUNKPILOT_LIVE_ADJUST``).
    live_adjust: bool = True
    #: The installation runs disaggregated topologies (``CHUNKPILOT_DISAGGREGATION``).
    disaggregation: bool = True
    #: The registry the default images come from (``CHUNKPILOT_IMAGE_REGISTRY``; None: their own).
    image_registry: str | None = None
    interval_s: float = DEFAULT_INTERVAL_S
    rollout_timeout_s: float = DEFAULT_ROLLOUT_TIMEOUT_S
    #: Tune with the digital twin (``CHUNKPILOT_TWIN``).
    twin: bool = True
    #: CPU seconds one ranking on the twin may spend.
    twin_cpu_seconds: float = DEFAULT_CPU_SECONDS
    #: Evaluations one ranking may make as well (None: the CPU seconds alone end it).
    twin_max_evaluations: int | None = None
    #: The engine pods' addresses for live adjustment (None: their pod IPs).
    pod_targets_file: str | None = None
    #: Where rankings run, and the operator's own CPU budget for them.
    twin_offload: Offload = field(default_factory=Offload)
    #: The twin Jobs' image (None: no Jobs).
    twin_job_image: str | None = None

    @property
    def settings(self) -> TunerSettings:
        """The decide-time settings of the tuning loop."""
        return TunerSettings(rollout_timeout_s=self.rollout_timeout_s, disaggregation=self.disaggregation)

    @property
    def twin_budget(self) -> TwinBudget:
        """What one ranking on the twin may spend."""
        return TwinBudget(cpu_s=self.twin_cpu_seconds, max_evaluations=self.twin_max_evaluations)

    @classmethod
    def from_env(cls, environ: Mapping[str, str], operator: OperatorConfig | None = None) -> TunerConfig:
        """The settings in ``environ`` (the operator process's environment, read once at start-up).

        ``operator``: the operator's configuration of this process, for the values the two share
        (None: read from ``environ`` as well). Raises :class:`ValueError` naming the variable of a
        value it cannot use.
        """
        shared = OperatorConfig.from_env(environ) if operator is None else operator
        return cls(
            prometheus_url=shared.prometheus_url,
            prometheus_auth=shared.prometheus_auth,
            optuna_storage=shared.optuna_storage,
            live_adjust=shared.live_adjust,
            disaggregation=shared.disaggregation,
            image_registry=shared.image_registry,
            interval_s=parse_seconds(environ, ENV_INTERVAL, DEFAULT_INTERVAL_S),
            rollout_timeout_s=parse_seconds(environ, ENV_ROLLOUT_TIMEOUT, DEFAULT_ROLLOUT_TIMEOUT_S),
            twin=parse_twin_switch(environ),
            twin_cpu_seconds=parse_cpu_seconds(environ),
            twin_max_evaluations=parse_max_evaluations(environ),
            pod_targets_file=environ.get(ENV_POD_TARGETS) or None,
            twin_offload=(offload := parse_offload(environ)),
            twin_job_image=parse_job_image(environ, offload.mode),
        )


def parse_offload(environ: Mapping[str, str]) -> Offload:
    """``CHUNKPILOT_TWIN_JOBS`` and ``CHUNKPILOT_TWIN_LOCAL_CORES``."""
    text = environ.get(ENV_TWIN_JOBS, "") or OffloadMode.OFF.value
    try:
        mode = OffloadMode(text.lower())
    except ValueError:
        choices = ", ".join(m.value for m in OffloadMode)
        raise ValueError(f"{ENV_TWIN_JOBS}={text!r}: expected one of {choices}") from None
    cores_text = environ.get(ENV_TWIN_LOCAL_CORES, "")
    if not cores_text:
        return Offload(mode)
    try:
        return Offload(mode, cores=float(cores_text))
    except ValueError:
        raise ValueError(f"{ENV_TWIN_LOCAL_CORES}={cores_text!r} is not a number of cores ≥ 0") from None


def parse_job_image(environ: Mapping[str, str], mode: OffloadMode) -> str | None:
    """``CHUNKPILOT_TWIN_JOB_IMAGE``, required when rankings may run as Jobs (``mode`` not off)."""
    image = environ.get(ENV_TWIN_JOB_IMAGE, "").strip() or None
    if image is None and mode is not OffloadMode.OFF:
        raise ValueError(
            f"{ENV_TWIN_JOBS} runs rankings as Jobs: set {ENV_TWIN_JOB_IMAGE} to the operator's image "
            "(the Helm chart does)"
        )
    return image


def parse_seconds(environ: Mapping[str, str], name: str, default: float) -> float:
    """A positive number of seconds in ``environ[name]`` (unset or empty: ``default``)."""
    text = environ.get(name, "")
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{name}={text!r} is not a number of seconds") from None
    if value <= 0:
        raise ValueError(f"{name}={text!r} must be greater than zero")
    return value


def parse_twin_switch(environ: Mapping[str, str]) -> bool:
    """Whether ``CHUNKPILOT_TWIN`` (``on`` or ``off``, default ``on``) lets the tuner use the twin."""
    text = environ.get(ENV_TWIN, "on").strip().lower()
    if text not in ("on", "off"):
        raise ValueError(f"{ENV_TWIN}={text!r}: use on or off")
    return text == "on"


def parse_cpu_seconds(environ: Mapping[str, str]) -> float:
    """The CPU seconds one ranking may spend (``CHUNKPILOT_TWIN_CPU_SECONDS``; unset or <= 0: the default)."""
    text = environ.get(ENV_TWIN_CPU_SECONDS, "")
    try:
        value = float(text) if text else DEFAULT_CPU_SECONDS
    except ValueError:
        raise ValueError(f"{ENV_TWIN_CPU_SECONDS}={text!r} is not a number of seconds") from None
    return value if value > 0 else DEFAULT_CPU_SECONDS


def parse_max_evaluations(environ: Mapping[str, str]) -> int | None:
    """The evaluations one ranking may make (``CHUNKPILOT_TWIN_MAX_EVALUATIONS``; None when unset)."""
    text = environ.get(ENV_TWIN_MAX_EVALUATIONS, "").strip()
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        raise ValueError(
            f"{ENV_TWIN_MAX_EVALUATIONS}={text!r} is not a whole number of evaluations"
        ) from None
    if value < 1:
        raise ValueError(f"{ENV_TWIN_MAX_EVALUATIONS}={text!r} must be at least 1")
    return value


__all__ = [
    "DEFAULT_INTERVAL_S",
    "DEFAULT_ROLLOUT_TIMEOUT_S",
    "ENV_INTERVAL",
    "ENV_POD_TARGETS",
    "ENV_ROLLOUT_TIMEOUT",
    "ENV_TWIN",
    "ENV_TWIN_CPU_SECONDS",
    "ENV_TWIN_MAX_EVALUATIONS",
    "TunerConfig",
    "parse_cpu_seconds",
    "parse_max_evaluations",
    "parse_seconds",
    "parse_twin_switch",
]

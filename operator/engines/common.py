"""What an engine renderer produces: a container recipe, or the reason it cannot."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from chunkpilot.operator.engines.versions import EngineVersion

from chunkpilot.api.engines import ProbeTiming as ProbeTiming  # the registry's, re-exported

#: The engine's HTTP port (OpenAI API, /health and /metrics) and its name.
ENGINE_PORT: Final = 8000
ENGINE_PORT_NAME: Final = "http"
#: Seconds the engine gets to drain in-flight requests after SIGTERM.
SHUTDOWN_TIMEOUT_S: Final = 30
#: Extra seconds the kubelet waits beyond the engine's own drain before SIGKILL.
TERMINATION_GRACE_MARGIN_S: Final = 15
#: Where a ``pvc://claim/path`` model is mounted.
MODEL_MOUNT_PATH: Final = "/mnt/models"


#: The probes of a GPU engine that names none: up to 30 minutes to load.
DEFAULT_PROBES: Final = ProbeTiming(startup_period_s=10, startup_failure_threshold=180)


@dataclass(frozen=True)
class ModelVolume:
    """A persistent volume claim holding the model weights (``pvc://claim/path``)."""

    claim_name: str
    mount_path: str = MODEL_MOUNT_PATH


@dataclass(frozen=True)
class EngineRender:
    """Everything the Deployment builder needs to run one engine container."""

    engine: str
    version: str
    image: str
    command: list[str]
    args: list[str]
    env: list[dict[str, Any]] = field(default_factory=list)
    gpus: int = 0
    resources: dict[str, dict[str, str]] = field(default_factory=dict)
    shm_size: str = "1Gi"
    probes: ProbeTiming = DEFAULT_PROBES
    shutdown_timeout_s: int = SHUTDOWN_TIMEOUT_S
    model_volume: ModelVolume | None = None
    #: The engine serves the plugin's live-adjustment route: the Deployment builder adds the
    #: bearer token (from the service's Secret) and a scratch volume for ``control_dir``.
    live_adjust: bool = False
    control_dir: str | None = None
    #: A per-pod scratch folder (an emptyDir) the engine's command writes its options file into.
    config_dir: str | None = None
    #: A per-pod folder (an emptyDir) for prometheus_client's multiprocess files: how the scheduler
    #: plugin's step telemetry, written in the engine-core process, reaches ``/metrics``.
    metrics_dir: str | None = None
    #: Where the engine serves Prometheus metrics (the PodMonitor scrapes it).
    metrics_path: str = "/metrics"
    #: Container ports besides the HTTP port, e.g. the NIXL side channel of a disaggregated pool.
    extra_ports: list[dict[str, Any]] = field(default_factory=list)

    @property
    def termination_grace_period_s(self) -> int:
        """Always above the engine's own drain timeout so it is never killed mid-drain."""
        return self.shutdown_timeout_s + TERMINATION_GRACE_MARGIN_S


@dataclass(frozen=True)
class UnsupportedKnob:
    """A knob set in the spec that the chosen engine version cannot honour."""

    knob: str  # manifest path, e.g. spec.engine.maxNumPartialPrefills
    flag: str
    engine: str
    version: str
    detail: str
    remedy: str

    reason: str = "UnsupportedKnob"

    @property
    def message(self) -> str:
        where = f"{self.engine} {self.version}"
        return f"{self.knob} ({self.flag}) is not supported by {where}: {self.detail}; {self.remedy}"


@dataclass(frozen=True)
class UnsupportedEngineVersion:
    """An engine version this operator cannot render arguments for."""

    engine: str
    version: str
    detail: str

    reason: str = "UnsupportedEngineVersion"

    @property
    def knob(self) -> str:
        return "spec.engine.version"

    @property
    def message(self) -> str:
        return f"spec.engine.version {self.version!r} is not supported for {self.engine}: {self.detail}"


def check_engine_version(
    engine: str, min_version: EngineVersion, version_text: str
) -> EngineVersion | UnsupportedEngineVersion:
    """Parse the spec's version and make sure it is ``min_version`` of ``engine`` or newer."""
    try:
        version = EngineVersion.parse(version_text)
    except ValueError as error:
        return UnsupportedEngineVersion(engine, version_text, str(error))
    if version < min_version:
        detail = f"the oldest supported release is {min_version}; raise spec.engine.version"
        return UnsupportedEngineVersion(engine, version_text, detail)
    return version


RenderProblem = UnsupportedKnob | UnsupportedEngineVersion
RenderResult = EngineRender | RenderProblem

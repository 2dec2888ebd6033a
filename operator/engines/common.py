"""What an engine renderer produces: a container recipe, or the reason it cannot."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from chunkpilot.engine.sim.semantics import SemanticsHook
from chunkpilot.operator.engines.flags import Vocabulary
from chunkpilot.operator.engines.versions import EngineVersion

from chunkpilot.api import InferenceServiceSpec
from chunkpilot.api.engines import EngineDescriptor
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
#: A renderer: the container recipe for a spec, or the problem that prevents one.
Renderer = Callable[[InferenceServiceSpec], RenderResult]


@dataclass(frozen=True)
class EngineSupport:
    """What the product does for one engine kind beyond its descriptor in the API's registry.

    Each kind's module, ``chunkpilot.operator.engines.<kind>``, defines one as ``SUPPORT``.
    """

    #: Its container recipe for a spec (argv from the knob table, env, probes, image).
    render: Renderer
    #: Its image when ``spec.engine.image`` is empty, for an engine version.
    default_image: Callable[[str], str]
    #: The scheduler the twin simulates a service of this kind with; None: vLLM's (the default).
    twin_semantics: SemanticsHook | None = None


def vetted_version(
    checked: EngineVersion | UnsupportedEngineVersion,
    knob_problem: Callable[[EngineVersion], RenderProblem | None],
) -> EngineVersion | RenderProblem:
    """The checked version, unless it or a knob the spec sets for it is refused."""
    if isinstance(checked, UnsupportedEngineVersion):
        return checked
    problem = knob_problem(checked)
    return checked if problem is None else problem


def model_argument(model_name: str) -> tuple[str, ModelVolume | None]:
    """The positional model argument and, for ``pvc://claim/path``, the volume to mount."""
    if model_name.startswith("hf://"):
        return model_name.removeprefix("hf://"), None
    if model_name.startswith("pvc://"):
        claim, _, path = model_name.removeprefix("pvc://").partition("/")
        mount = ModelVolume(claim_name=claim)
        return f"{MODEL_MOUNT_PATH}/{path}".rstrip("/"), mount
    return model_name, None


def served_model_name(spec: InferenceServiceSpec) -> str:
    """``spec.model.servedName`` or, by default, the model id without its URI scheme."""
    if spec.model.served_name:
        return spec.model.served_name
    _, _, name = spec.model.name.rpartition("://")
    return name


def listen_args(flags: Vocabulary) -> list[str]:
    """The server flags that bind the engine to every address on :data:`ENGINE_PORT`."""
    return [*flags.server_option("host", "0.0.0.0"), *flags.server_option("port", ENGINE_PORT)]


def model_limit_args(flags: Vocabulary, spec: InferenceServiceSpec, length_flag: str) -> list[str]:
    """The model revision (when pinned) and the context length, under the dialect's ``length_flag``."""
    args = flags.server_option("revision", spec.model.revision) if spec.model.revision else []
    return [*args, *flags.server_option(length_flag, spec.model.max_model_len)]


def model_token_env(spec: InferenceServiceSpec) -> list[dict[str, Any]]:
    """``HF_TOKEN`` from the Secret the spec names, or nothing when it names none."""
    ref = spec.model.token_secret_ref
    if ref is None:
        return []
    return [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}]


def gpu_engine_render(
    spec: InferenceServiceSpec,
    descriptor: EngineDescriptor,
    *,
    version: EngineVersion,
    default_image: Callable[[str], str],
    command: list[str],
    args: list[str],
    env: list[dict[str, Any]],
    shm_size: str,
    **details: Any,
) -> EngineRender:
    """The recipe of ``descriptor``'s engine on ``tensorParallelSize`` GPUs, its model volume mounted.

    The image is the spec's, else ``default_image`` of the spec's version; the name, probes and
    metrics path are the registry's. ``details`` are the further :class:`EngineRender` fields.
    """
    gpus = spec.engine.tensor_parallel_size
    _, volume = model_argument(spec.model.name)
    return EngineRender(
        engine=descriptor.display_name,
        version=str(version),
        image=spec.engine.image or default_image(spec.engine.version),
        command=command,
        args=args,
        env=env,
        gpus=gpus,
        resources={"requests": {"nvidia.com/gpu": str(gpus)}, "limits": {"nvidia.com/gpu": str(gpus)}},
        shm_size=shm_size,
        probes=descriptor.probes,
        model_volume=volume,
        metrics_path=descriptor.metrics_path,
        **details,
    )

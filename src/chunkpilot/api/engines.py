"""The engine registry: every engine kind defined once, as data.

One frozen :class:`EngineDescriptor` per kind of ``spec.engine.kind`` says what the API and its
readers need to know of it: its name, flag dialect, default version, image repository, probe
timing, metric and health paths, server flags, capabilities (which the CEL rules name), the
simulator's argument markers and whether the demo offers it. :data:`ENGINES` holds them, in the
order the CRD lists the kinds. Every list of engines is derived from it: the CRD enum and the
``kind`` and ``version`` field docs, the CEL rules that name kinds (``chunkpilot.api.inferenceservice``),
the dialects, their names and server flags (``chunkpilot.api.knobs``), the default versions, the
metric paths, the kinds the simulator image runs and the demo's engines.

What the product does for an engine (its container recipe and default image, the scheduler the twin
simulates it with) lives in one module per kind, ``chunkpilot.operator.engines.<kind>``, found by the
kind's name; its dialect names its metric-name table and the simulator semantics it runs with. A new
engine is its descriptor here plus that module.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True)
class ProbeTiming:
    """Probe periods for one engine: a long startup allowance, then fast readiness checks."""

    startup_period_s: int
    startup_failure_threshold: int
    readiness_period_s: int = 5
    liveness_period_s: int = 10
    liveness_failure_threshold: int = 6

    @property
    def startup_budget_s(self) -> int:
        """How long the engine may take to load before the kubelet restarts it."""
        return self.startup_period_s * self.startup_failure_threshold


@dataclass(frozen=True)
class EngineDescriptor:
    """One engine kind, as data: what the API, the CRD and every list of engines say of it."""

    #: ``spec.engine.kind``.
    kind: str
    #: The engine's name in messages and documentation (``vLLM``, ``TensorRT-LLM``).
    display_name: str
    #: Its flag dialect: the knob table's column it is rendered from (:attr:`KnobSpec.flags`).
    dialect: str
    #: How the CRD's ``kind`` field describes it (``trtllm (TensorRT-LLM's trtllm-serve)``).
    kind_doc: str
    #: The release rendered when ``spec.engine.version`` is unset.
    default_version: str
    #: The repository of its default image (the renderer picks the tag).
    image_repository: str
    #: The kubelet's probes of its container.
    probes: ProbeTiming
    #: Flags rendered from other parts of the spec (model, port), without dashes; with the knobs'
    #: flags they are the dialect's managed flags, which ``extraArgs`` may not repeat.
    server_flags: tuple[str, ...]
    #: Options the spec does not render but that override what it sets (a config file, the token
    #: budget under another name, parallelism the pod is not sized for), without dashes, each with
    #: why ``extraArgs`` may not set them (:func:`chunkpilot.api.options.guarded`).
    reserved_options: tuple[tuple[str, str], ...] = ()
    #: How messages name its command line (``SGLang flags``); empty for the default dialect's.
    command_line: str = ""
    #: Where it serves Prometheus metrics (the PodMonitor's path) and answers health checks.
    metrics_path: str = "/metrics"
    health_path: str = "/health"
    #: Runs on GPUs (else on CPU).
    gpu: bool = True
    #: Chunkpilot renders prefill/decode disaggregation for it (its KV-transfer connectors).
    disaggregation: bool = False
    #: Chunkpilot's scheduler plugin installs into its images (``spec.engine.pluginInstalled``).
    plugin: bool = False
    #: ``model.servedName`` may not contain ``:`` (SGLang reserves ``model:adapter`` for LoRA).
    reserves_colon_in_served_name: bool = False
    #: The simulator image runs it in its own dialect (``chunkpilot sim serve --engine KIND``).
    simulated: bool = False
    #: Flags only this engine spells so: ``sim serve`` without ``--engine`` takes its dialect from them.
    simulator_markers: tuple[str, ...] = ()
    #: ``chunkpilot demo --engine`` offers it.
    demo: bool = False


#: Why parallelism the spec does not render is reserved: the pod is sized for tensor parallelism alone.
_SIZED_FOR_TP: Final = (
    "the pod's GPUs are sized from spec.engine.tensorParallelSize alone: one replica is one engine;"
    " scale with spec.replicas"
)
_CONFIG_FILE: Final = (
    "a config file can set any option, the managed ones too: set spec.engine fields, and other"
    " options as extraArgs"
)

VLLM_ENGINE: Final = EngineDescriptor(
    kind="vllm",
    display_name="vLLM",
    dialect="vllm",
    kind_doc="vllm",
    default_version="0.33.0",
    image_repository="vllm/vllm-openai",
    probes=ProbeTiming(startup_period_s=10, startup_failure_threshold=180),
    server_flags=("host", "port", "served-model-name", "revision", "max-model-len"),
    plugin=True,
    reserved_options=(
        ("config", _CONFIG_FILE),
        ("max-num-scheduled-tokens", "it overrides the token budget: set spec.engine.maxNumBatchedTokens"),
        ("scheduler-cls", "the operator picks the scheduler (the plugin's, for lanes and live adjustment)"),
        ("pipeline-parallel-size", _SIZED_FOR_TP),
        ("data-parallel-size", _SIZED_FOR_TP),
        ("data-parallel-size-local", _SIZED_FOR_TP),
        ("prefill-context-parallel-size", _SIZED_FOR_TP),
    ),
    disaggregation=True,
)

SGLANG_ENGINE: Final = EngineDescriptor(
    kind="sglang",
    display_name="SGLang",
    dialect="sglang",
    kind_doc="sglang",
    default_version="0.5.23",
    image_repository="lmsysorg/sglang",
    # Weights load, then CUDA-graph capture: up to 30 minutes before the kubelet gives up.
    probes=ProbeTiming(startup_period_s=10, startup_failure_threshold=180),
    server_flags=(
        "model-path",
        "model",
        "host",
        "port",
        "served-model-name",
        "revision",
        "context-length",
        "enable-metrics",
        "tensor-parallel-size",
    ),
    reserved_options=(
        ("config", _CONFIG_FILE),
        (
            "max-total-tokens",
            "it overrides the KV-cache size spec.engine.gpuMemoryUtilization sets: set that instead",
        ),
        ("pp-size", _SIZED_FOR_TP),
        ("dp-size", _SIZED_FOR_TP),
    ),
    command_line="SGLang",
    reserves_colon_in_served_name=True,
    simulated=True,
    simulator_markers=(
        "--model-path",
        "--chunked-prefill-size",
        "--max-running-requests",
        "--context-length",
    ),
    demo=True,
)

TRTLLM_ENGINE: Final = EngineDescriptor(
    kind="trtllm",
    display_name="TensorRT-LLM",
    dialect="trtllm",
    kind_doc="trtllm (TensorRT-LLM's trtllm-serve)",
    default_version="1.2.1",
    image_repository="nvcr.io/nvidia/tensorrt-llm/release",
    # Weights load, kernel autotuning and CUDA-graph capture: up to 40 minutes.
    probes=ProbeTiming(startup_period_s=10, startup_failure_threshold=240),
    server_flags=(
        "host",
        "port",
        "backend",
        "revision",
        "max_seq_len",
        "extra_llm_api_options",
        "config",
        "enable_chunked_prefill",
        "tensor_parallel_size",
        "tp_size",
        "free_gpu_memory_fraction",
        "kv_cache_free_gpu_memory_fraction",
    ),
    reserved_options=(
        ("config", _CONFIG_FILE),
        ("pipeline_parallel_size", _SIZED_FOR_TP),
        ("context_parallel_size", _SIZED_FOR_TP),
    ),
    command_line="trtllm-serve",
    metrics_path="/prometheus/metrics",
    simulated=True,
    simulator_markers=("--max_num_tokens", "--max_batch_size", "--extra_llm_api_options", "--max_seq_len"),
    demo=True,
)

SIM_ENGINE: Final = EngineDescriptor(
    kind="sim",
    display_name="simulator",
    dialect=VLLM_ENGINE.dialect,
    kind_doc="sim (the CPU simulator with vLLM's API)",
    default_version=VLLM_ENGINE.default_version,
    image_repository="ghcr.io/chunkpilot/chunkpilot",
    probes=ProbeTiming(startup_period_s=2, startup_failure_threshold=60, liveness_period_s=10),
    server_flags=VLLM_ENGINE.server_flags,
    gpu=False,
    disaggregation=True,
    demo=True,
)

#: The registry: every engine kind, in the order the CRD lists them; the first is the default kind.
ENGINES: Final[dict[str, EngineDescriptor]] = {
    engine.kind: engine for engine in (VLLM_ENGINE, SGLANG_ENGINE, TRTLLM_ENGINE, SIM_ENGINE)
}
#: ``spec.engine.kind`` when unset.
DEFAULT_KIND: Final = VLLM_ENGINE.kind


def engine(kind: str) -> EngineDescriptor:
    """The descriptor of ``kind``; KeyError naming the registered kinds otherwise."""
    try:
        return ENGINES[kind]
    except KeyError:
        raise KeyError(f"unknown engine kind {kind!r}; known: {', '.join(ENGINES)}") from None


def kinds(*, where: str | None = None) -> tuple[str, ...]:
    """The registered kinds, in registry order; with ``where``, those whose capability of that name is on."""
    return tuple(e.kind for e in ENGINES.values() if where is None or getattr(e, where))


def dialects() -> tuple[str, ...]:
    """The flag dialects of the registered engines, in the order their first speaker is registered."""
    return tuple(dict.fromkeys(e.dialect for e in ENGINES.values()))


def dialect_owner(dialect: str) -> EngineDescriptor:
    """The engine that names ``dialect`` (the first registered speaker of it)."""
    return next(e for e in ENGINES.values() if e.dialect == dialect)


# --------------------------------------------------------------------------- derived CRD text


def either(words: Iterable[str]) -> str:
    """``a``, ``a or b``, ``a, b or c``."""
    items = list(words)
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} or {items[-1]}"


def cel_list(values: Iterable[str]) -> str:
    """A CEL list literal of strings: ``['vllm', 'sim']``."""
    return "[" + ", ".join(f"'{value}'" for value in values) + "]"


def kind_is_not(field: str, values: tuple[str, ...]) -> str:
    """CEL: ``field`` is none of ``values`` (``!=`` for one, ``!(... in [...])`` for several)."""
    return f"{field} != '{values[0]}'" if len(values) == 1 else f"!({field} in {cel_list(values)})"


def kind_field_doc() -> str:
    """The CRD documentation of ``spec.engine.kind``."""
    on_gpus = [e.kind_doc for e in ENGINES.values() if e.gpu]
    on_cpus = [e.kind_doc for e in ENGINES.values() if not e.gpu]
    return f"Engine: {either(on_gpus)} on GPUs, or {either(on_cpus)}."


def version_field_doc() -> str:
    """The CRD documentation of ``spec.engine.version``: each dialect's default release."""
    defaults = []
    for dialect in dialects():
        owner = dialect_owner(dialect)
        also = [
            e.kind
            for e in ENGINES.values()
            if e is not owner and e.dialect == dialect and e.default_version == owner.default_version
        ]
        suffix = f" (also for {either(also)})" if also else ""
        defaults.append(f"{owner.display_name} {owner.default_version}{suffix}")
    return (
        f"Engine version the flags are rendered for, e.g. {ENGINES[DEFAULT_KIND].default_version};"
        f" unset: {', '.join(defaults)}."
    )


def image_repository(reference: str) -> str:
    """The repository of an image reference, without its tag and digest.

    ``registry:5000/org/engine:v1@sha256:...`` -> ``registry:5000/org/engine``: a digest follows
    ``@``; a tag is what follows the last ``:`` after the last ``/`` (a ``:`` before it is a
    registry's port).
    """
    name = reference.strip().partition("@")[0]
    slash = name.rfind("/")
    colon = name.rfind(":")
    return name[:colon] if colon > slash else name


def _registry_host(component: str) -> bool:
    """Whether the first component of a reference names a registry (``ghcr.io``, ``host:5000``)."""
    return "." in component or ":" in component or component == "localhost"


def image_path(reference: str) -> str:
    """The repository of an image reference without its registry: what a mirror keeps.

    ``ghcr.io/chunkpilot/engine-vllm:v1`` and ``mirror.internal:5000/chunkpilot/engine-vllm@sha256:...``
    -> ``chunkpilot/engine-vllm``; a Docker Hub name (``vllm/vllm-openai``) is its own path.
    """
    first, slash, rest = image_repository(reference).partition("/")
    return rest if slash and _registry_host(first) else first + slash + rest


def with_registry(reference: str, registry: str | None) -> str:
    """``reference`` pulled from ``registry`` instead (its path, tag and digest kept); unchanged for None.

    ``with_registry("vllm/vllm-openai:v0.33.0", "mirror.internal")`` ->
    ``mirror.internal/vllm/vllm-openai:v0.33.0``.
    """
    if not registry:
        return reference
    reference = reference.strip()
    first, slash, rest = reference.partition("/")
    path = rest if slash and _registry_host(first) else reference
    return f"{registry.rstrip('/')}/{path}"


__all__ = [
    "DEFAULT_KIND",
    "ENGINES",
    "SGLANG_ENGINE",
    "SIM_ENGINE",
    "TRTLLM_ENGINE",
    "VLLM_ENGINE",
    "EngineDescriptor",
    "ProbeTiming",
    "cel_list",
    "dialect_owner",
    "dialects",
    "either",
    "engine",
    "image_path",
    "image_repository",
    "kind_field_doc",
    "kind_is_not",
    "kinds",
    "version_field_doc",
    "with_registry",
]

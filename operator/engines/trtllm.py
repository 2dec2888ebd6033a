"""Render ``trtllm-serve serve`` and its LLM-API options file for the TensorRT-LLM version in the spec.

The knob table's TensorRT-LLM dialect: the token budget is ``--max_num_tokens``, the
running-request limit ``--max_batch_size``; settings ``trtllm-serve`` has no flag for
(chunked context, block reuse, the KV-cache memory fraction, the capacity scheduler and
context-chunking policies) are keys of the options file given by ``--extra_llm_api_options``.

The options file is written by the container's own command from an environment
variable into a per-pod ``emptyDir`` (rather than a ConfigMap): it is then part of the
pod template, so changing it rolls the pods exactly like changing a flag, every canary
carries its own, and there is no further object to own, garbage-collect or grant RBAC
for. The file replaces whole sections of the CLI's settings (``kv_cache_config``,
``scheduler_config``), so every key of a section is rendered into the file.

Metrics: Prometheus histograms at ``/prometheus/metrics`` (request metrics need
``return_perf_metrics``), iteration statistics as JSON at ``/metrics``
(``enable_iter_perf_stats``). ``/health`` answers 200 once the engine is up.
"""

from __future__ import annotations

from typing import Any, Final

from chunkpilot.engine.sim.semantics import trtllm_semantics
from chunkpilot.operator.engines import common
from chunkpilot.operator.engines.flags import OptionsFile, Scalar, Vocabulary
from chunkpilot.operator.engines.knobcheck import first_unsupported
from chunkpilot.operator.engines.versions import EngineVersion

from chunkpilot.api import InferenceServiceSpec
from chunkpilot.api.engines import TRTLLM_ENGINE
from chunkpilot.api.knobs import TRTLLM, TRTLLM_PINNED

#: Oldest release whose command line this renderer knows (1.0: the PyTorch backend by default,
#: ``/prometheus/metrics``); the pinned one is validated against its option definitions.
MIN_VERSION: Final = EngineVersion(1, 0, 0)
PINNED_VERSION: Final = TRTLLM_PINNED
CONFIG_DIR: Final = "/etc/chunkpilot"
OPTIONS_FILE: Final = f"{CONFIG_DIR}/llm-api.yaml"
#: The environment variable the options file is written from.
OPTIONS_ENV: Final = "CHUNKPILOT_LLM_API_OPTIONS"
#: Write the options file, then replace the shell with trtllm-serve (it gets the signals).
LAUNCH_SCRIPT: Final = f'printf \'%s\\n\' "${OPTIONS_ENV}" > {OPTIONS_FILE} && exec trtllm-serve "$@"'
COMMAND: Final = ("/bin/sh", "-c", LAUNCH_SCRIPT, "trtllm-serve")

#: The LLM-API options that switch on the metrics (not knobs: always rendered).
METRICS_OPTIONS: Final[dict[str, Scalar]] = {"enable_iter_perf_stats": True, "return_perf_metrics": True}
#: The PyTorch backend (``trtllm-serve``'s default since 1.0, rendered explicitly).
BACKEND: Final = "pytorch"
#: The TensorRT-LLM flag dialect: every managed flag and options-file key is spelt by it.
FLAGS: Final = Vocabulary(TRTLLM)


def default_trtllm_image(version: str) -> str:
    """The NGC release image for ``version`` (tags carry no ``v``)."""
    return f"{TRTLLM_ENGINE.image_repository}:{version.removeprefix('v')}"


def check_version(version_text: str) -> EngineVersion | common.UnsupportedEngineVersion:
    """Parse the spec's version and make sure this renderer knows its command line."""
    return common.check_engine_version(TRTLLM_ENGINE.display_name, MIN_VERSION, version_text)


def llm_api_options(spec: InferenceServiceSpec) -> OptionsFile:
    """The options file's content: the knobs ``trtllm-serve`` has no flag for (the knob table's
    options-file keys), and the metrics switches."""
    return FLAGS.options_file(spec.engine, plain=METRICS_OPTIONS)


def _scalar(value: Scalar) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def options_yaml(options: OptionsFile) -> str:
    """Block-style YAML of a two-level mapping of plain scalars (keys in order)."""
    lines: list[str] = []
    for key, value in options.items():
        if isinstance(value, dict):
            lines.append(f"{key}:")
            lines += [f"  {sub}: {_scalar(item)}" for sub, item in value.items()]
        else:
            lines.append(f"{key}: {_scalar(value)}")
    return "\n".join(lines)


def trtllm_args(spec: InferenceServiceSpec) -> list[str]:
    """The ``trtllm-serve`` argument vector (``serve <model> ...``); knobs already checked.

    Every flag is the knob table's TensorRT-LLM dialect (:data:`FLAGS`).
    """
    engine = spec.engine
    model, _ = common.model_argument(spec.model.name)
    args = [
        "serve",
        model,
        *common.listen_args(FLAGS),
        *FLAGS.server_option("backend", BACKEND),
        *common.model_limit_args(FLAGS, spec, "max_seq_len"),
    ]
    args += FLAGS.option("max_num_batched_tokens", engine.max_num_batched_tokens)
    args += FLAGS.option("max_num_seqs", engine.max_num_seqs)
    args += FLAGS.option("tensor_parallel_size", engine.tensor_parallel_size)
    args += FLAGS.server_option("extra_llm_api_options", OPTIONS_FILE)
    return [*args, *engine.extra_args]


def trtllm_env(spec: InferenceServiceSpec) -> list[dict[str, Any]]:
    """The options file's content and, when the spec names its Secret, the model token."""
    return [
        {"name": OPTIONS_ENV, "value": options_yaml(llm_api_options(spec))},
        *common.model_token_env(spec),
    ]


def _served_name_problem(spec: InferenceServiceSpec, version: EngineVersion) -> common.UnsupportedKnob | None:
    """trtllm-serve names the model by its positional argument; it has no --common.served_model_name."""
    model, _ = common.model_argument(spec.model.name)
    if spec.model.served_name is None or common.served_model_name(spec) == model:
        return None
    return common.UnsupportedKnob(
        knob="spec.model.servedName",
        flag="(none)",
        engine=TRTLLM_ENGINE.display_name,
        version=str(version),
        detail=f"trtllm-serve serves the model under its model argument ({model})",
        remedy="unset servedName or set it to the model argument",
    )


def render_trtllm(spec: InferenceServiceSpec) -> common.RenderResult:
    """Container recipe for a TensorRT-LLM engine, or the problem that prevents one."""
    version = common.vetted_version(
        check_version(spec.engine.version),
        lambda checked: first_unsupported(spec, TRTLLM, checked) or _served_name_problem(spec, checked),
    )
    if not isinstance(version, EngineVersion):
        return version
    return common.gpu_engine_render(
        spec,
        TRTLLM_ENGINE,
        version=version,
        default_image=default_trtllm_image,
        command=list(COMMAND),
        args=trtllm_args(spec),
        env=trtllm_env(spec),
        shm_size=f"{max(8, 8 * spec.engine.tensor_parallel_size)}Gi",
        config_dir=CONFIG_DIR,
    )


#: TensorRT-LLM's support: its own scheduler in the twin.
SUPPORT: Final = common.EngineSupport(
    render=render_trtllm, default_image=default_trtllm_image, twin_semantics=trtllm_semantics
)

"""Render ``python3 -m sglang.launch_server`` for the SGLang version in the spec.

The knob table's SGLang dialect: the token budget is ``--chunked-prefill-size`` (``-1``
with chunked prefill off), the running-request limit ``--max-running-requests``, prefix
caching is on unless ``--disable-radix-cache``. Knobs without an SGLang flag (e.g.
``maxNumActiveSeqs``, ``longPrefillTokenThreshold``, speculative decoding) are refused
with ``UnsupportedKnob``. Metrics (``sglang:*``) are served on the API port with
``--enable-metrics``; ``/health`` answers once the server is ready.
"""

from __future__ import annotations

from typing import Any, Final

from chunkpilot.operator.engines.common import (
    ENGINE_PORT,
    EngineRender,
    RenderResult,
    UnsupportedEngineVersion,
    check_engine_version,
)
from chunkpilot.operator.engines.flags import Vocabulary
from chunkpilot.operator.engines.knobcheck import first_unsupported
from chunkpilot.operator.engines.versions import EngineVersion
from chunkpilot.operator.engines.vllm import model_argument, served_model_name

from chunkpilot.api import InferenceServiceSpec
from chunkpilot.api.engines import SGLANG_ENGINE
from chunkpilot.api.knobs import SGLANG, SGLANG_PINNED

ENGINE_NAME: Final = "SGLang"
#: Oldest release whose command line this renderer knows (the pinned one is validated).
MIN_VERSION: Final = EngineVersion(0, 4, 0)
PINNED_VERSION: Final = SGLANG_PINNED
SGLANG_IMAGE_REPOSITORY: Final = SGLANG_ENGINE.image_repository
SGLANG_PROBES: Final = SGLANG_ENGINE.probes
METRICS_PATH: Final = SGLANG_ENGINE.metrics_path
COMMAND: Final = ("python3", "-m", "sglang.launch_server")
#: The SGLang flag dialect: every managed flag is spelt by it.
FLAGS: Final = Vocabulary(SGLANG)


def default_sglang_image(version: str) -> str:
    """The upstream image for ``version`` (tags carry a ``v``)."""
    return f"{SGLANG_IMAGE_REPOSITORY}:v{version.removeprefix('v')}"


def check_version(version_text: str) -> EngineVersion | UnsupportedEngineVersion:
    """Parse the spec's version and make sure this renderer knows its command line."""
    return check_engine_version(ENGINE_NAME, MIN_VERSION, version_text)


def sglang_args(spec: InferenceServiceSpec) -> list[str]:
    """The ``sglang.launch_server`` argument vector; knobs already checked.

    Every flag is the knob table's SGLang dialect (:data:`FLAGS`).
    """
    engine = spec.engine
    model, _ = model_argument(spec.model.name)
    args = [
        *FLAGS.server_option("model-path", model),
        *FLAGS.server_option("host", "0.0.0.0"),
        *FLAGS.server_option("port", ENGINE_PORT),
        *FLAGS.server_option("served-model-name", served_model_name(spec)),
    ]
    if spec.model.revision:
        args += FLAGS.server_option("revision", spec.model.revision)
    args += FLAGS.server_option("context-length", spec.model.max_model_len)
    # One flag holds the budget and the switch: the budget, or -1 with chunked prefill off.
    chunk = engine.max_num_batched_tokens if engine.enable_chunked_prefill else -1
    args += FLAGS.option("max_num_batched_tokens", chunk)
    args += FLAGS.option("max_num_seqs", engine.max_num_seqs)
    args += FLAGS.option("max_prefill_tokens", engine.max_prefill_tokens)
    args += FLAGS.option("schedule_policy", engine.schedule_policy)
    args += FLAGS.present("enable_mixed_chunk", engine.enable_mixed_chunk)
    # Prefix caching (the radix cache) is on unless disabled.
    args += FLAGS.present("enable_prefix_caching", not engine.enable_prefix_caching)
    args += FLAGS.option("gpu_memory_utilization", engine.gpu_memory_utilization)
    args += FLAGS.option("tensor_parallel_size", engine.tensor_parallel_size)
    args.append(FLAGS.server("enable-metrics"))
    return [*args, *engine.extra_args]


def sglang_env(spec: InferenceServiceSpec) -> list[dict[str, Any]]:
    """The model token, when the spec names its Secret."""
    ref = spec.model.token_secret_ref
    if ref is None:
        return []
    return [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}]


def render_sglang(spec: InferenceServiceSpec) -> RenderResult:
    """Container recipe for an SGLang engine, or the problem that prevents one."""
    version = check_version(spec.engine.version)
    if isinstance(version, UnsupportedEngineVersion):
        return version
    problem = first_unsupported(spec, SGLANG, version)
    if problem is not None:
        return problem
    gpus = spec.engine.tensor_parallel_size
    _, volume = model_argument(spec.model.name)
    return EngineRender(
        engine=ENGINE_NAME,
        version=str(version),
        image=spec.engine.image or default_sglang_image(spec.engine.version),
        command=list(COMMAND),
        args=sglang_args(spec),
        env=sglang_env(spec),
        gpus=gpus,
        resources={"requests": {"nvidia.com/gpu": str(gpus)}, "limits": {"nvidia.com/gpu": str(gpus)}},
        # Tensor-parallel workers exchange through shared memory (NCCL); SGLang's docs run with 32g.
        shm_size=f"{max(8, 8 * gpus)}Gi",
        probes=SGLANG_PROBES,
        model_volume=volume,
        metrics_path=METRICS_PATH,
    )

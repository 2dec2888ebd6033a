"""Render ``python3 -m sglang.launch_server`` for the SGLang version in the spec.

The knob table's SGLang dialect: the token budget is ``--chunked-prefill-size`` (``-1``
with chunked prefill off), the running-request limit ``--max-running-requests``, prefix
caching is on unless ``--disable-radix-cache``. Knobs without an SGLang flag (e.g.
``maxNumActiveSeqs``, ``longPrefillTokenThreshold``, speculative decoding) are refused
with ``UnsupportedKnob``. Metrics (``sglang:*``) are served on the API port with
``--enable-metrics``; ``/health`` answers once the server is ready.
"""

from __future__ import annotations

from typing import Final

from chunkpilot.engine.sim.semantics import sglang_semantics
from chunkpilot.operator.engines import common
from chunkpilot.operator.engines.flags import Vocabulary
from chunkpilot.operator.engines.knobcheck import first_unsupported
from chunkpilot.operator.engines.versions import EngineVersion

from chunkpilot.api import InferenceServiceSpec
from chunkpilot.api.engines import SGLANG_ENGINE
from chunkpilot.api.knobs import SGLANG, SGLANG_PINNED

#: Oldest release whose command line this renderer knows (the pinned one is validated).
MIN_VERSION: Final = EngineVersion(0, 4, 0)
PINNED_VERSION: Final = SGLANG_PINNED
COMMAND: Final = ("python3", "-m", "sglang.launch_server")
#: The SGLang flag dialect: every managed flag is spelt by it.
FLAGS: Final = Vocabulary(SGLANG)


def default_sglang_image(version: str) -> str:
    """The upstream image for ``version`` (tags carry a ``v``)."""
    return f"{SGLANG_ENGINE.image_repository}:v{version.removeprefix('v')}"


def check_version(version_text: str) -> EngineVersion | common.UnsupportedEngineVersion:
    """Parse the spec's version and make sure this renderer knows its command line."""
    return common.check_engine_version(SGLANG_ENGINE.display_name, MIN_VERSION, version_text)


def sglang_args(spec: InferenceServiceSpec) -> list[str]:
    """The ``sglang.launch_server`` argument vector; knobs already checked.

    Every flag is the knob table's SGLang dialect (:data:`FLAGS`).
    """
    engine = spec.engine
    model, _ = common.model_argument(spec.model.name)
    args = [
        *FLAGS.server_option("model-path", model),
        *common.listen_args(FLAGS),
        *FLAGS.server_option("served-model-name", common.served_model_name(spec)),
        *common.model_limit_args(FLAGS, spec, "context-length"),
    ]
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


def render_sglang(spec: InferenceServiceSpec) -> common.RenderResult:
    """Container recipe for an SGLang engine, or the problem that prevents one."""
    version = common.vetted_version(
        check_version(spec.engine.version), lambda checked: first_unsupported(spec, SGLANG, checked)
    )
    if not isinstance(version, EngineVersion):
        return version
    return common.gpu_engine_render(
        spec,
        SGLANG_ENGINE,
        version=version,
        default_image=default_sglang_image,
        command=list(COMMAND),
        args=sglang_args(spec),
        env=common.model_token_env(spec),
        # Tensor-parallel workers exchange through shared memory (NCCL); SGLang's docs run with 32g.
        shm_size=f"{max(8, 8 * spec.engine.tensor_parallel_size)}Gi",
    )


#: SGLang's support: its own scheduler in the twin.
SUPPORT: Final = common.EngineSupport(
    render=render_sglang, default_image=default_sglang_image, twin_semantics=sglang_semantics
)

"""The ``vllm serve`` engine flags the simulator accepts, and their translation into a SimConfig.

Spelling and defaults follow vLLM 0.33. The scheduler and engine knobs are the knob table's
(:mod:`chunkpilot.api.knobs`, vLLM dialect), so a knob the operator renders is a flag the
simulator parses. Flags that only matter to a real GPU engine
(``--dtype``, ``--load-format``, ``--revision``, ``--trust-remote-code``, ``--scheduler-cls``,
``--additional-config`` …) are accepted and validated for shape, then ignored. Unknown flags are
rejected by argparse, as ``vllm serve`` does.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from chunkpilot.engine.sim.engine import SimConfig, default_limits
from chunkpilot.engine.sim.kvcache import BLOCK_SIZE
from chunkpilot.engine.sim.kvtransfer import (
    DEFAULT_ABORT_TIMEOUT_S,
    DEFAULT_KV_BANDWIDTH_GBPS,
    DEFAULT_KV_LATENCY_MS,
    KVConnectorConfig,
    KVTransfer,
    parse_kv_transfer_config,
)
from chunkpilot.engine.sim.profiles.loader import (
    ModelProfile,
    accelerator_names,
    load_accelerator,
    load_model,
    model_names,
)
from chunkpilot.engine.sim.scheduler import (
    SIMULATED_CAPACITY_POLICIES,
    CapacitySchedulerPolicy,
    ContextChunkingPolicy,
    Engine,
    SchedulerConfig,
    SchedulingPolicy,
    SGLangSchedulerConfig,
    TrtllmSchedulerConfig,
)

from chunkpilot.api.engines import dialects
from chunkpilot.api.knobs import KNOBS, VLLM, KnobSpec

DEFAULT_SPEC_ACCEPTANCE = 0.7


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc.msg})") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


class _Switch(argparse.Action):
    """``--flag``, ``--no-flag`` and the older ``--flag=true|false`` spelling of vLLM switches."""

    _VALUES = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}

    def __init__(self, option_strings: list[str], dest: str, default: bool = False, **kwargs: Any) -> None:
        negated = [f"--no-{s.removeprefix('--')}" for s in option_strings if s.startswith("--")]
        super().__init__(
            [*option_strings, *negated], dest, nargs="?", default=default, metavar="BOOL", **kwargs
        )

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        if option_string is not None and option_string.startswith("--no-"):
            if values is not None:
                parser.error(f"{option_string} takes no value")
            setattr(namespace, self.dest, False)
            return
        if values is None:
            setattr(namespace, self.dest, True)
            return
        value = self._VALUES.get(str(values).lower())
        if value is None:
            parser.error(f"{option_string}: expected true or false, got {values!r}")
        setattr(namespace, self.dest, value)


#: Short spellings vLLM also accepts.
_SHORT_FLAGS = {"tensor_parallel_size": ("-tp",)}
_VALUE_TYPES: dict[str, Any] = {"int": int, "float": float, "json": _json_object}


def _help(knob: KnobSpec) -> str:
    return knob.doc.replace(f" ({knob.flag(VLLM).flag})", "")


def _add_knob_flag(group: argparse._ArgumentGroup, knob: KnobSpec) -> None:
    """The knob's vLLM flag (parsed into the attribute argparse names after the flag)."""
    names = [knob.flag(VLLM).flag, *_SHORT_FLAGS.get(knob.name, ())]
    # The API's default is vLLM's, except where vLLM picks one from the hardware (see default_limits).
    default = None if knob.hardware_default else knob.default
    if knob.kind == "bool":
        group.add_argument(*names, action=_Switch, default=bool(default), help=_help(knob))
    else:
        value_type = _VALUE_TYPES[knob.kind]
        group.add_argument(*names, type=value_type, default=default, help=_help(knob))


def add_engine_flags(parser: argparse.ArgumentParser) -> None:
    """Add the vLLM engine/scheduler flags and the simulator-only flags to ``parser``."""
    g = parser.add_argument_group("vLLM engine flags")
    g.add_argument("--served-model-name", nargs="+", default=None, help="name(s) the API answers to")
    g.add_argument("--revision", default=None, help="accepted for compatibility (ignored)")
    g.add_argument("--max-model-len", type=int, default=None, help="context length (default: the model's)")
    for knob in KNOBS:
        if VLLM in knob.flags:
            _add_knob_flag(g, knob)
    g.add_argument("--max-num-scheduled-tokens", type=int, default=None, help="alias that caps the budget")
    g.add_argument("--shutdown-timeout", type=float, default=0.0, help="seconds to drain on SIGTERM")
    g.add_argument("--scheduler-cls", default=None, help="accepted for compatibility (ignored)")
    g.add_argument("--additional-config", type=_json_object, default=None, help="accepted for compatibility")
    g.add_argument("--block-size", type=int, default=BLOCK_SIZE, choices=(8, 16, 32, 64, 128))
    g.add_argument("--seed", type=int, default=0)
    g.add_argument(
        "--dtype", default="auto", choices=("auto", "half", "float16", "bfloat16", "float", "float32")
    )
    g.add_argument("--load-format", default="auto", help="accepted for compatibility (ignored)")
    g.add_argument("--disable-log-requests", action="store_true")
    g.add_argument("--trust-remote-code", action="store_true")
    g.add_argument(
        "--kv-transfer-config",
        type=_kv_transfer_config,
        default=None,
        help='KV connector for prefill/decode disaggregation, e.g. \'{"kv_connector":"NixlConnector",'
        '"kv_role":"kv_both"}\'; each request\'s kv_transfer_params then decide its role',
    )
    s = parser.add_argument_group("simulator flags")
    s.add_argument(
        "--gpu", default="h100", help=f"accelerator profile ({', '.join(accelerator_names())}) or JSON path"
    )
    s.add_argument("--step-profile", default=None, help="measured step profile JSON from the GPU probe")
    s.add_argument(
        "--spec-acceptance-rate", type=float, default=None, help="draft token acceptance probability"
    )
    s.add_argument(
        "--kv-bandwidth-gbps",
        type=float,
        default=DEFAULT_KV_BANDWIDTH_GBPS,
        help="KV-transfer bandwidth between prefill and decode engines, GB/s "
        f"(default {DEFAULT_KV_BANDWIDTH_GBPS:g})",
    )
    s.add_argument(
        "--kv-latency-ms",
        type=float,
        default=DEFAULT_KV_LATENCY_MS,
        help=f"fixed latency of one request's KV transfer, ms (default {DEFAULT_KV_LATENCY_MS:g})",
    )


def _kv_transfer_config(text: str) -> KVConnectorConfig:
    try:
        return parse_kv_transfer_config(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--kv-transfer-config").lstrip(": ")) from exc


def kv_transfer_from_args(args: argparse.Namespace) -> KVTransfer:
    """The KV link ``--kv-bandwidth-gbps`` and ``--kv-latency-ms`` describe (ValueError if invalid)."""
    return KVTransfer(
        getattr(args, "kv_bandwidth_gbps", DEFAULT_KV_BANDWIDTH_GBPS),
        getattr(args, "kv_latency_ms", DEFAULT_KV_LATENCY_MS),
        float(os.environ.get("VLLM_NIXL_ABORT_REQUEST_TIMEOUT", DEFAULT_ABORT_TIMEOUT_S)),
    )


def _model_len(args_value: int | None, flag: str, profile: ModelProfile) -> int:
    max_model_len = args_value or profile.max_position_embeddings
    if max_model_len > profile.max_position_embeddings:
        raise ValueError(
            f"{flag} {max_model_len} exceeds the {profile.max_position_embeddings} positions of "
            f"{profile.name}"
        )
    return max_model_len


def _args_sim_config(
    model: str, args: argparse.Namespace, scheduler: SchedulerConfig, memory_fraction: float
) -> SimConfig:
    """The SimConfig of ``scheduler`` with the flags every engine shares (GPU, TP, step profile, seed)."""
    return SimConfig(
        model=model,
        accelerator=args.gpu,
        tensor_parallel_size=args.tensor_parallel_size,
        scheduler=scheduler,
        gpu_memory_utilization=memory_fraction,
        step_profile=args.step_profile,
        seed=args.seed,
    )


def sim_config_from_args(model: str, args: argparse.Namespace) -> SimConfig:
    """Translate parsed flags into a validated SimConfig (raises ValueError naming the flag)."""
    profile = load_model(model)
    accelerator = load_accelerator(args.gpu)
    default_budget, default_seqs = default_limits(accelerator)
    max_model_len = _model_len(args.max_model_len, "--max-model-len", profile)
    budget = args.max_num_batched_tokens
    if budget is None:
        budget = default_budget if args.enable_chunked_prefill else max(default_budget, max_model_len)
    if args.max_num_scheduled_tokens is not None:
        budget = min(budget, args.max_num_scheduled_tokens)
    seqs = args.max_num_seqs if args.max_num_seqs is not None else min(default_seqs, budget)
    spec = args.speculative_config or {}
    k = int(spec.get("num_speculative_tokens", 0) or 0)
    acceptance = args.spec_acceptance_rate
    if acceptance is None:
        acceptance = float(spec.get("acceptance_rate", DEFAULT_SPEC_ACCEPTANCE))
    scheduler = SchedulerConfig(
        max_num_batched_tokens=budget,
        max_num_seqs=seqs,
        max_num_active_seqs=args.max_num_active_seqs,
        max_model_len=max_model_len,
        enable_chunked_prefill=args.enable_chunked_prefill,
        long_prefill_token_threshold=args.long_prefill_token_threshold,
        long_prefill_token_threshold_adaptive=args.long_prefill_token_threshold_adaptive,
        max_num_partial_prefills=args.max_num_partial_prefills,
        max_long_partial_prefills=args.max_long_partial_prefills,
        enable_prefix_caching=args.enable_prefix_caching,
        num_speculative_tokens=k,
        spec_acceptance_rate=acceptance,
        block_size=args.block_size,
    )
    return _args_sim_config(model, args, scheduler, args.gpu_memory_utilization)


def profiles_help() -> str:
    """One line listing the built-in profiles (for --help epilogs)."""
    return f"models: {', '.join(model_names())}; accelerators: {', '.join(accelerator_names())}"


# ---------------------------------------------------------------------------------------------------
# Other engines. Each speaks its own command line (SGLang ``python -m sglang.launch_server``,
# TensorRT-LLM ``trtllm-serve``), checked against their sources (sglang 0.5.23
# ``srt/arg_groups/fields``; TensorRT-LLM 1.x ``tensorrt_llm/commands/serve.py``); the scheduler knobs
# they share with vLLM land in the same fields, their own in their configs' (see
# :class:`SGLangSchedulerConfig`, :class:`TrtllmSchedulerConfig`).

#: SGLang's ``--schedule-policy`` values and the ones the simulator reproduces.
SGLANG_POLICIES = (
    "lpm", "random", "fcfs", "dfs-weight", "lof", "priority", "routing-key", "hrrn",
    "shortest-prefill-first",
)  # fmt: skip
SGLANG_SIMULATED_POLICIES = ("fcfs", "lpm", "lof", "random")
#: ``--max-running-requests`` when unset: SGLang takes the request pool size, which is at least
#: 2048 (``max(context-derived, 2048)``, at most 4096) on the GPUs profiled here.
SGLANG_DEFAULT_MAX_RUNNING = 2048
#: ``--mem-fraction-static`` when unset (SGLang derives it from the GPU; about this on 80 GB).
SGLANG_DEFAULT_MEM_FRACTION = 0.88
SGLANG_DEFAULT_PORT = 30000
TRTLLM_DEFAULT_MAX_BATCH_SIZE = 2048
TRTLLM_DEFAULT_MAX_NUM_TOKENS = 8192
TRTLLM_DEFAULT_TOKENS_PER_BLOCK = 32
TRTLLM_DEFAULT_PORT = 8000
SGLANG_PINNED_VERSION = "0.5.23"
TRTLLM_PINNED_VERSION = "1.2.1"


def _sglang_chunk_default(accelerator_memory_bytes: int) -> int:
    """SGLang's ``--chunked-prefill-size`` default by GPU memory (``_handle_gpu_memory_settings``)."""
    mib = accelerator_memory_bytes / 2**20
    if mib < 20 * 1024:
        return 2048
    if mib < 60 * 1024:
        return 4096
    if mib < 160 * 1024:
        return 8192
    return 16384


def _add_sim_only(parser: argparse.ArgumentParser) -> None:
    s = parser.add_argument_group("simulator flags")
    s.add_argument(
        "--gpu", default="h100", help=f"accelerator profile ({', '.join(accelerator_names())}) or JSON path"
    )
    s.add_argument("--step-profile", default=None, help="measured step profile JSON from the GPU probe")


def add_sglang_flags(parser: argparse.ArgumentParser) -> None:
    """SGLang ``launch_server`` flags for the scheduler knobs (and a few accepted, then ignored)."""
    g = parser.add_argument_group("SGLang server flags")
    g.add_argument("--served-model-name", default=None, help="name the API answers to")
    g.add_argument("--tp-size", "--tensor-parallel-size", dest="tensor_parallel_size", type=int, default=1)
    g.add_argument("--context-length", type=int, default=None, help="context length (default: the model's)")
    g.add_argument(
        "--chunked-prefill-size",
        type=int,
        default=None,
        help="tokens per prefill chunk, -1 disables chunking (default: by GPU memory)",
    )
    g.add_argument("--max-prefill-tokens", type=int, default=16384, help="tokens in one prefill batch")
    g.add_argument("--max-running-requests", type=int, default=None, help="running-request limit")
    g.add_argument("--schedule-policy", default="fcfs", choices=SGLANG_POLICIES)
    g.add_argument("--enable-mixed-chunk", action="store_true", help="mix prefill chunks with decodes")
    g.add_argument("--enable-metrics", action="store_true", help="serve Prometheus metrics on /metrics")
    g.add_argument("--mem-fraction-static", type=float, default=None, help="memory fraction for weights+KV")
    g.add_argument("--disable-radix-cache", action="store_true", help="no prefix caching")
    g.add_argument("--page-size", type=int, default=1, help="accepted (KV is modelled in 16-token blocks)")
    g.add_argument("--random-seed", dest="seed", type=int, default=0)
    g.add_argument("--trust-remote-code", action="store_true")
    g.add_argument("--dtype", default="auto")
    g.add_argument("--log-level", default="info")
    _add_sim_only(parser)


def add_trtllm_flags(parser: argparse.ArgumentParser) -> None:
    """``trtllm-serve`` flags for the scheduler knobs (and a few accepted, then ignored)."""
    g = parser.add_argument_group("trtllm-serve flags")
    g.add_argument("--backend", default="pytorch", choices=("pytorch", "tensorrt", "trt", "_autodeploy"))
    g.add_argument("--max_batch_size", type=int, default=None, help="most requests scheduled at once")
    g.add_argument("--max_num_tokens", type=int, default=None, help="token budget of one batch")
    g.add_argument("--max_seq_len", type=int, default=None, help="prompt plus output (default: the model's)")
    g.add_argument("--max_beam_width", type=int, default=1, choices=(1,), help="only 1 is simulated")
    g.add_argument("--tensor_parallel_size", "--tp_size", dest="tensor_parallel_size", type=int, default=1)
    g.add_argument(
        "--kv_cache_free_gpu_memory_fraction",
        "--free_gpu_memory_fraction",
        dest="free_gpu_memory_fraction",
        type=float,
        default=None,
        help="fraction of the free memory after the weights for the KV cache (0.9)",
    )
    g.add_argument(
        "--enable_chunked_prefill",
        action="store_true",
        default=None,
        help="chunked prefill (chunked context)",
    )
    g.add_argument(
        "--extra_llm_api_options",
        "--config",
        dest="extra_llm_api_options",
        default=None,
        help="YAML file of LLM API options (enable_chunked_prefill, scheduler_config, kv_cache_config, ...)",
    )
    g.add_argument("--trust_remote_code", action="store_true")
    g.add_argument("--log_level", default="info")
    g.add_argument("--seed", type=int, default=0, help="simulator seed")
    _add_sim_only(parser)
    parser.add_argument(
        "--engine-version",
        default=TRTLLM_PINNED_VERSION,
        help=f"TensorRT-LLM release whose metric names to serve (default {TRTLLM_PINNED_VERSION}; "
        "before 1.2 they carry no trtllm_ prefix)",
    )


#: Top-level keys of the extra LLM-API options file the simulator reads.
_TRTLLM_KEYS = {
    "enable_chunked_prefill": bool,
    "max_num_tokens": int,
    "max_batch_size": int,
    "max_seq_len": int,
    "scheduler_config": dict,
    "kv_cache_config": dict,
}
_CAPACITY_POLICIES = {p.value for p in SIMULATED_CAPACITY_POLICIES}
_CHUNKING_POLICIES = tuple(p.value for p in ContextChunkingPolicy)


#: The environment variable the operator's TensorRT-LLM launch script writes the options file from.
TRTLLM_OPTIONS_ENV = "CHUNKPILOT_LLM_API_OPTIONS"


def load_trtllm_options(path: str) -> dict[str, Any]:
    """Read and check the ``--extra_llm_api_options`` YAML (raises ValueError naming the key).

    Where the file does not exist but :data:`TRTLLM_OPTIONS_ENV` is set (a pod run outside its
    container, whose launch script would have written the file from it), its value is read instead.
    """
    import yaml  # only TensorRT-LLM's options file is YAML: not imported by every simulator run

    inline = os.environ.get(TRTLLM_OPTIONS_ENV)
    try:
        if inline and not os.path.exists(path):
            data = yaml.safe_load(inline)
        else:
            with open(path, encoding="utf-8") as f:
                data = yaml.safe_load(f)
    except OSError as exc:
        raise ValueError(f"--extra_llm_api_options {path}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise ValueError(f"--extra_llm_api_options {path}: not valid YAML ({exc})") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"--extra_llm_api_options {path}: must be a mapping of LLM API options")
    for key, kind in _TRTLLM_KEYS.items():
        value = data.get(key)
        if key in data and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
            raise ValueError(f"--extra_llm_api_options: {key} must be a {kind.__name__}")
    sched = data.get("scheduler_config") or {}
    policy = sched.get("capacity_scheduler_policy", CapacitySchedulerPolicy.GUARANTEED_NO_EVICT.value)
    if policy not in _CAPACITY_POLICIES:
        raise ValueError(
            f"--extra_llm_api_options: scheduler_config.capacity_scheduler_policy {policy!r} is not "
            f"simulated; use one of {', '.join(sorted(_CAPACITY_POLICIES))}"
        )
    chunking = sched.get("context_chunking_policy", _CHUNKING_POLICIES[0])
    if chunking not in _CHUNKING_POLICIES:
        raise ValueError(
            f"--extra_llm_api_options: scheduler_config.context_chunking_policy {chunking!r} is not "
            f"simulated; use one of {', '.join(_CHUNKING_POLICIES)}"
        )
    kv = data.get("kv_cache_config") or {}
    for key in ("tokens_per_block",):
        if key in kv and (not isinstance(kv[key], int) or isinstance(kv[key], bool) or kv[key] < 1):
            raise ValueError(f"--extra_llm_api_options: kv_cache_config.{key} must be a positive integer")
    if "free_gpu_memory_fraction" in kv and not isinstance(kv["free_gpu_memory_fraction"], int | float):
        raise ValueError("--extra_llm_api_options: kv_cache_config.free_gpu_memory_fraction must be a number")
    return data


def _sglang_config(model: str, args: argparse.Namespace) -> SimConfig:
    profile = load_model(model)
    accelerator = load_accelerator(args.gpu)
    if args.schedule_policy not in SGLANG_SIMULATED_POLICIES:
        raise ValueError(
            f"--schedule-policy {args.schedule_policy} is not simulated; use one of "
            f"{', '.join(SGLANG_SIMULATED_POLICIES)}"
        )
    chunk = args.chunked_prefill_size
    if chunk is None:
        chunk = _sglang_chunk_default(accelerator.memory_bytes)
    chunked = chunk > 0
    max_model_len = _model_len(args.context_length, "--context-length", profile)
    scheduler = SGLangSchedulerConfig(
        max_num_batched_tokens=chunk if chunked else args.max_prefill_tokens,
        max_num_seqs=args.max_running_requests or SGLANG_DEFAULT_MAX_RUNNING,
        max_model_len=max_model_len,
        enable_chunked_prefill=chunked,
        enable_prefix_caching=not args.disable_radix_cache,
        max_prefill_tokens=args.max_prefill_tokens,
        enable_mixed_chunk=args.enable_mixed_chunk,
        policy=SchedulingPolicy(args.schedule_policy),
    )
    fraction = args.mem_fraction_static
    if fraction is None:
        fraction = SGLANG_DEFAULT_MEM_FRACTION
    return _args_sim_config(model, args, scheduler, fraction)


def _trtllm_config(model: str, args: argparse.Namespace) -> SimConfig:
    profile = load_model(model)
    accelerator = load_accelerator(args.gpu)
    extra = load_trtllm_options(args.extra_llm_api_options) if args.extra_llm_api_options else {}
    sched_extra = extra.get("scheduler_config") or {}
    kv_extra = extra.get("kv_cache_config") or {}

    def pick(name: str, default: Any) -> Any:
        # The options file overrides the command line, as update_llm_args_with_extra_dict does.
        if name in extra:
            return extra[name]
        value = getattr(args, name)
        return default if value is None else value

    chunked = bool(pick("enable_chunked_prefill", False))
    budget = int(pick("max_num_tokens", TRTLLM_DEFAULT_MAX_NUM_TOKENS))
    seq_len = pick("max_seq_len", None)
    if seq_len is None and not chunked:
        # Without chunking a prompt longer than max_num_tokens can never run: the engine refuses it.
        seq_len = min(profile.max_position_embeddings, budget)
    max_model_len = _model_len(seq_len, "--max_seq_len", profile)
    fraction = kv_extra.get("free_gpu_memory_fraction", args.free_gpu_memory_fraction)
    if fraction is None:
        fraction = 0.9
    if not 0.0 < float(fraction) <= 1.0:
        raise ValueError(f"--kv_cache_free_gpu_memory_fraction must be in (0, 1], got {fraction}")
    # TensorRT-LLM gives the KV cache a fraction of the memory left after the weights; the
    # simulator's utilisation is a fraction of all of it.
    weights = profile.weight_bytes / (accelerator.memory_bytes * args.tensor_parallel_size)
    utilisation = min(1.0, float(fraction) * (1.0 - weights) + weights)
    scheduler = TrtllmSchedulerConfig(
        max_num_batched_tokens=budget,
        max_num_seqs=int(pick("max_batch_size", TRTLLM_DEFAULT_MAX_BATCH_SIZE)),
        max_model_len=max_model_len,
        enable_chunked_prefill=chunked,
        enable_prefix_caching=bool(kv_extra.get("enable_block_reuse", True)),
        capacity_scheduler_policy=CapacitySchedulerPolicy(
            sched_extra.get("capacity_scheduler_policy", CapacitySchedulerPolicy.GUARANTEED_NO_EVICT.value)
        ),
        context_chunking_policy=ContextChunkingPolicy(
            sched_extra.get("context_chunking_policy", ContextChunkingPolicy.FIRST_COME_FIRST_SERVED.value)
        ),
        chunk_unit_size=int(kv_extra.get("tokens_per_block", TRTLLM_DEFAULT_TOKENS_PER_BLOCK)),
    )
    return _args_sim_config(model, args, scheduler, utilisation)


#: The engines ``sim --engine`` names: the registry's dialects (each with its flags and semantics).
ENGINE_NAMES = dialects()


def add_flags_for(parser: argparse.ArgumentParser, engine: str) -> None:
    """Add ``engine``'s own scheduler flags (and the simulator's) to ``parser``."""
    kind = Engine(engine)
    if kind is Engine.SGLANG:
        add_sglang_flags(parser)
    elif kind is Engine.TRTLLM:
        add_trtllm_flags(parser)
    else:
        add_engine_flags(parser)


def config_for(model: str, args: argparse.Namespace) -> SimConfig:
    """Translate the parsed flags of ``args.engine`` (default vllm) into a validated SimConfig."""
    kind = Engine(getattr(args, "engine", Engine.VLLM.value))
    if kind is Engine.SGLANG:
        return _sglang_config(model, args)
    if kind is Engine.TRTLLM:
        return _trtllm_config(model, args)
    return sim_config_from_args(model, args)


def engine_server_defaults(engine: str, model: str, accelerator: str, max_model_len: int) -> SimConfig:
    """``engine``'s server defaults as its own flags give them on ``accelerator``, chunked prefill on.

    vLLM keeps the simulator's defaults (its budget and sequence limit come from
    :func:`~chunkpilot.engine.sim.engine.default_limits`); SGLang and TensorRT-LLM get their own
    (``--chunked-prefill-size`` by GPU memory, ``--max-running-requests``, ``--schedule-policy fcfs``
    without mixed chunks; ``max_num_tokens``, ``max_batch_size``, the ``GUARANTEED_NO_EVICT`` capacity
    scheduler) and memory fraction.
    """
    if Engine(engine) is Engine.VLLM:
        return SimConfig(
            model=model, accelerator=accelerator, scheduler=SchedulerConfig(max_model_len=max_model_len)
        )
    parser = argparse.ArgumentParser(add_help=False)
    add_flags_for(parser, engine)
    args = parser.parse_args(["--gpu", accelerator])
    args.engine = engine
    sim = config_for(model, args)
    scheduler = replace(sim.scheduler, max_model_len=max_model_len, enable_chunked_prefill=True)
    return replace(sim, scheduler=scheduler, step_profile=None)

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
from collections.abc import Sequence
from typing import Any

from chunkpilot.engine.sim.engine import SimConfig, default_limits
from chunkpilot.engine.sim.kvcache import BLOCK_SIZE
from chunkpilot.engine.sim.profiles.loader import accelerator_names, load_accelerator, load_model, model_names
from chunkpilot.engine.sim.scheduler import SchedulerConfig

from chunkpilot.api import EngineSpec
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
    default = None if knob.hardware_default else EngineSpec.model_fields[knob.name].get_default()
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
    s = parser.add_argument_group("simulator flags")
    s.add_argument(
        "--gpu", default="h100", help=f"accelerator profile ({', '.join(accelerator_names())}) or JSON path"
    )
    s.add_argument("--step-profile", default=None, help="measured step profile JSON from the GPU probe")
    s.add_argument(
        "--spec-acceptance-rate", type=float, default=None, help="draft token acceptance probability"
    )


def sim_config_from_args(model: str, args: argparse.Namespace) -> SimConfig:
    """Translate parsed flags into a validated SimConfig (raises ValueError naming the flag)."""
    profile = load_model(model)
    accelerator = load_accelerator(args.gpu)
    default_budget, default_seqs = default_limits(accelerator)
    max_model_len = args.max_model_len or profile.max_position_embeddings
    if max_model_len > profile.max_position_embeddings:
        raise ValueError(
            f"--max-model-len {max_model_len} exceeds the {profile.max_position_embeddings} "
            f"positions of {profile.name}"
        )
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
    return SimConfig(
        model=model,
        accelerator=args.gpu,
        tensor_parallel_size=args.tensor_parallel_size,
        scheduler=scheduler,
        gpu_memory_utilization=args.gpu_memory_utilization,
        step_profile=args.step_profile,
        seed=args.seed,
    )


def profiles_help() -> str:
    """One line listing the built-in profiles (for --help epilogs)."""
    return f"models: {', '.join(model_names())}; accelerators: {', '.join(accelerator_names())}"

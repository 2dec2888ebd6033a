"""The knob table: every engine setting of ``spec.engine`` defined once.

One :class:`KnobSpec` row per setting: its field name (snake and camel case), its
command-line flag per flag dialect (with the engine versions that honour it), its
label in summaries, whether the tuner searches it, whether it can be lowered on a
running engine, and the documentation of its CRD field.  Derived from the table:

- the CRD fields' documentation (``EngineSpec``, ``EngineConfig``, ``TuningBounds``),
- :data:`MANAGED_FLAGS`, the flags ``extraArgs`` may not repeat,
- the tuned knob names (``EngineConfig.KNOBS``, the tuner's ``Knob`` and Optuna parameter
  names, the fields of ``TunedConfig``),
- :func:`summary`, the one short form of a configuration (``budget=3072 seqs=256``),
- the version checks of the renderers (``chunkpilot.operator.engines.vllm.KNOB_RULES``, and
  ``chunkpilot.operator.engines.knobcheck`` for every dialect) and the tuner's judgement of
  what an engine honours,
- the knob mapping table of the docs (``chunkpilot.api.docs.render_knob_table``),
- the simulator's scheduler flags (``chunkpilot.engine.sim.flags``).

A flag dialect is the command-line vocabulary of one engine family (vLLM, SGLang,
TensorRT-LLM); the simulator speaks vLLM's.  A row without an entry for a dialect is a
knob that engine cannot honour: the renderers refuse it (``UnsupportedKnob``) when it is
set.  TensorRT-LLM settings without a ``trtllm-serve`` flag are keys of its LLM-API
options file (``EngineFlag.yaml``, dotted paths such as
``scheduler_config.capacity_scheduler_policy``).  The pydantic models keep explicit typed
fields; ``tests/api/test_knobs.py`` proves they and this table agree.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Final, Literal

from chunkpilot.api.engines import (
    ENGINES,
    SGLANG_ENGINE,
    SIM_ENGINE,
    TRTLLM_ENGINE,
    VLLM_ENGINE,
    dialect_owner,
    dialects,
)

# --------------------------------------------------------------------------- engine versions

_VERSION_RE = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?(?:[.+-]?[0-9A-Za-z.+-]*)?$")


@dataclass(frozen=True, order=True)
class EngineVersion:
    """A release version as ``major.minor.patch``; suffixes such as ``.post1`` are ignored."""

    major: int
    minor: int
    patch: int = 0

    @classmethod
    def parse(cls, text: str) -> EngineVersion:
        """Parse ``0.33.0``, ``0.8``, ``v0.10.1`` or ``0.8.5.post1``; raise ValueError otherwise."""
        match = _VERSION_RE.match(text.strip())
        if match is None:
            raise ValueError(f"invalid engine version {text!r}: use a release number such as 0.33.0")
        major, minor, patch = match.groups()
        return cls(int(major), int(minor), int(patch or 0))

    @classmethod
    def lenient(cls, text: str) -> EngineVersion:
        """The first three numbers in ``text`` (missing ones 0); 0.0.0 when there are none."""
        numbers = [int(n) for n in re.findall(r"\d+", text)[:3]]
        return cls(*[*numbers, 0, 0, 0][:3])

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"


#: vLLM releases the rows refer to.
VLLM_V0_REMOVED: Final = EngineVersion(0, 9, 0)  # the V0 scheduler (partial-prefill limits) is gone
VLLM_0_33: Final = EngineVersion(0, 33, 0)

#: SGLang and TensorRT-LLM releases the rows and renderers are pinned to (validated against
#: SGLang's own argument parser and TensorRT-LLM's option definitions at these versions).
SGLANG_PINNED: Final = EngineVersion.parse(SGLANG_ENGINE.default_version)
TRTLLM_PINNED: Final = EngineVersion.parse(TRTLLM_ENGINE.default_version)


class Dialect(StrEnum):
    """A flag dialect: the command-line vocabulary of an engine family, and the scheduling
    semantics and metric names the simulator reproduces for it (``sim --engine``).

    The members name the registry's dialects (:func:`chunkpilot.api.engines.dialects`; the rows'
    ``flags`` are keyed by them); ``tests/api/test_engines.py`` proves the two agree."""

    VLLM = VLLM_ENGINE.dialect
    SGLANG = SGLANG_ENGINE.dialect
    TRTLLM = TRTLLM_ENGINE.dialect


#: The dialects as plain strings (the keys of :attr:`KnobSpec.flags`).
VLLM: Final[str] = Dialect.VLLM.value
SGLANG: Final[str] = Dialect.SGLANG.value
TRTLLM: Final[str] = Dialect.TRTLLM.value
#: The registry's dialects, in the order their engines are registered.
DIALECTS: Final = dialects()
#: Engine names in messages and documentation, per dialect (the name of the engine that owns it).
ENGINE_NAMES: Final[Mapping[str, str]] = {d: dialect_owner(d).display_name for d in DIALECTS}


class EngineKind(StrEnum):
    """The engine kinds Chunkpilot ships, by name, for code that singles one out.

    The list of kinds is the registry's (:data:`chunkpilot.api.engines.ENGINES`, which the CRD enum
    and ``spec.engine.kind``'s validation read); each member is a registered kind, and the simulator
    speaks vLLM's dialect (:func:`dialect_of`)."""

    VLLM = VLLM_ENGINE.kind
    SGLANG = SGLANG_ENGINE.kind
    TRTLLM = TRTLLM_ENGINE.kind
    SIM = SIM_ENGINE.kind


def registered_kind(kind: str) -> str:
    """``kind`` if registered (as its :class:`EngineKind` member when it has one); ValueError otherwise."""
    if kind not in ENGINES:
        raise ValueError(f"unknown engine kind {kind!r}; known: {', '.join(ENGINES)}")
    return EngineKind(kind) if kind in EngineKind._value2member_map_ else kind


class CapacitySchedulerPolicy(StrEnum):
    """TensorRT-LLM ``scheduler_config.capacity_scheduler_policy`` (every value 1.2.1 accepts; the
    simulator reproduces a subset, ``chunkpilot.engine.sim.scheduler.SIMULATED_CAPACITY_POLICIES``)."""

    GUARANTEED_NO_EVICT = "GUARANTEED_NO_EVICT"
    MAX_UTILIZATION = "MAX_UTILIZATION"
    STATIC_BATCH = "STATIC_BATCH"


class ContextChunkingPolicy(StrEnum):
    """TensorRT-LLM ``scheduler_config.context_chunking_policy``."""

    FIRST_COME_FIRST_SERVED = "FIRST_COME_FIRST_SERVED"
    EQUAL_PROGRESS = "EQUAL_PROGRESS"


# --------------------------------------------------------------------------- rows


@dataclass(frozen=True)
class EngineFlag:
    """A knob's flag in one dialect, honoured in the releases ``[since, until)``.

    ``plugin``: from ``until`` on, the Chunkpilot scheduler plugin enforces the knob instead.
    ``yaml``: ``flag`` is a dotted key of the engine's options file (TensorRT-LLM's
    ``--extra_llm_api_options``), not a command-line flag.
    """

    flag: str
    since: EngineVersion | None = None
    until: EngineVersion | None = None
    plugin: bool = False
    yaml: bool = False

    @property
    def name(self) -> str:
        """The flag without its dashes, e.g. ``max-num-seqs``."""
        return self.flag.removeprefix("--")

    @property
    def where(self) -> str:
        """How the setting is spelt in messages: ``--flag`` or ``options file key a.b``."""
        return f"options file key {self.flag}" if self.yaml else self.flag

    @property
    def versioned(self) -> bool:
        """True when some releases do not accept the flag."""
        return self.since is not None or self.until is not None

    def supports(self, version: EngineVersion) -> bool:
        """Whether ``version`` honours the flag natively (without the scheduler plugin)."""
        return (self.since is None or version >= self.since) and (self.until is None or version < self.until)


ValueKind = Literal["int", "bool", "float", "json", "enum"]


@dataclass(frozen=True)
class KnobSpec:
    """One engine setting of ``spec.engine`` (a row of the knob table)."""

    name: str
    camel: str
    kind: ValueKind
    doc: str
    flags: Mapping[str, EngineFlag]
    #: Short label in summaries (tuned knobs only).
    label: str | None = None
    #: Searched by the autotuner (part of ``EngineConfig``, ``TuningBounds`` and the Optuna space).
    tunable: bool = False
    #: Can be lowered on a running engine through the live-adjustment route (no restart).
    live: bool = False
    #: The value that means "not set" (left out of summaries, never refused by a version check).
    off: object = None
    #: The engine picks its default from the hardware when the flag is absent (vLLM does for these).
    hardware_default: bool = False
    #: Note added to the ``spec.autotune.bounds`` field's documentation.
    bounds_note: str = ""
    #: ``spec.engine``'s default, vLLM's where it has one (the CRD's default and the simulator's flag).
    default: object = None

    def flag(self, dialect: str = VLLM) -> EngineFlag:
        """The flag in ``dialect``; KeyError when that engine family has no such setting."""
        return self.flags[dialect]

    def honoured_by(self, dialect: str, version: EngineVersion) -> bool:
        """Whether ``version`` of the engine family ``dialect`` has a flag for this knob."""
        return dialect in self.flags and self.flags[dialect].supports(version)

    def is_set(self, value: object) -> bool:
        """Whether ``value`` of this knob asks the engine for something (not unset or off)."""
        return value is not None and value != self.off

    @property
    def path(self) -> str:
        """Manifest path, e.g. ``spec.engine.maxNumSeqs``."""
        return f"spec.engine.{self.camel}"

    @property
    def bounds_doc(self) -> str:
        """Documentation of the knob's ``spec.autotune.bounds`` field."""
        note = f" ({self.bounds_note})" if self.bounds_note else ""
        return f"Search range of {self.camel}{note}."


def _vllm(
    flag: str, since: EngineVersion | None = None, until: EngineVersion | None = None, plugin: bool = False
) -> dict[str, EngineFlag]:
    return {VLLM: EngineFlag(flag, since, until, plugin)}


def _flags(
    vllm: str | None = None,
    sglang: str | None = None,
    trtllm: str | None = None,
    *,
    trtllm_yaml: bool = False,
) -> dict[str, EngineFlag]:
    """A row's flags in every dialect that has one (unversioned)."""
    out: dict[str, EngineFlag] = {}
    if vllm is not None:
        out[VLLM] = EngineFlag(vllm)
    if sglang is not None:
        out[SGLANG] = EngineFlag(sglang)
    if trtllm is not None:
        out[TRTLLM] = EngineFlag(trtllm, yaml=trtllm_yaml)
    return out


#: The table, in the order of the ``spec.engine`` fields (and of summaries).
KNOBS: Final[tuple[KnobSpec, ...]] = (
    KnobSpec(
        "max_num_batched_tokens",
        "maxNumBatchedTokens",
        "int",
        (
            "Token budget per forward pass (--max-num-batched-tokens): the chunked-prefill dial;"
            " SGLang --chunked-prefill-size, TensorRT-LLM --max_num_tokens."
        ),
        {
            **_vllm("--max-num-batched-tokens"),
            **_flags(sglang="--chunked-prefill-size", trtllm="--max_num_tokens"),
        },
        label="budget",
        tunable=True,
        live=True,
        hardware_default=True,
        default=8192,
    ),
    KnobSpec(
        "max_num_seqs",
        "maxNumSeqs",
        "int",
        (
            "Maximum sequences per step (--max-num-seqs); SGLang --max-running-requests,"
            " TensorRT-LLM --max_batch_size."
        ),
        {**_vllm("--max-num-seqs"), **_flags(sglang="--max-running-requests", trtllm="--max_batch_size")},
        label="seqs",
        tunable=True,
        live=True,
        hardware_default=True,
        default=256,
    ),
    KnobSpec(
        "max_num_active_seqs",
        "maxNumActiveSeqs",
        "int",
        "Cap on running requests, buffers unchanged (--max-num-active-seqs); <= maxNumSeqs.",
        _vllm("--max-num-active-seqs", since=VLLM_0_33),
        label="active",
        tunable=True,
        live=True,
    ),
    KnobSpec(
        "enable_chunked_prefill",
        "enableChunkedPrefill",
        "bool",
        (
            "Split long prompts across steps (--enable-chunked-prefill); SGLang --chunked-prefill-size -1"
            " when off, TensorRT-LLM enable_chunked_prefill (chunked context)."
        ),
        {
            **_vllm("--enable-chunked-prefill"),
            **_flags(sglang="--chunked-prefill-size", trtllm="enable_chunked_prefill", trtllm_yaml=True),
        },
        default=True,
    ),
    KnobSpec(
        "long_prefill_token_threshold",
        "longPrefillTokenThreshold",
        "int",
        "Per-request prefill tokens per step cap (--long-prefill-token-threshold); 0 = off.",
        _vllm("--long-prefill-token-threshold"),
        label="lpt",
        tunable=True,
        off=0,
        bounds_note="0 = off is allowed",
        default=0,
    ),
    KnobSpec(
        "long_prefill_token_threshold_adaptive",
        "longPrefillTokenThresholdAdaptive",
        "bool",
        "Adapt the threshold to load (--long-prefill-token-threshold-adaptive).",
        _vllm("--long-prefill-token-threshold-adaptive", since=VLLM_0_33),
        off=False,
        default=False,
    ),
    KnobSpec(
        "max_num_partial_prefills",
        "maxNumPartialPrefills",
        "int",
        (
            "Concurrent partial prefills (--max-num-partial-prefills); accepted only by older vLLM"
            " releases (e.g. 0.8.x); for newer engines the operator provides it or refuses it in a condition."
        ),
        _vllm("--max-num-partial-prefills", until=VLLM_V0_REMOVED, plugin=True),
        label="partial",
        tunable=True,
        bounds_note="tuned only where the engine honours it",
    ),
    KnobSpec(
        "max_long_partial_prefills",
        "maxLongPartialPrefills",
        "int",
        "Concurrent long partial prefills (--max-long-partial-prefills).",
        _vllm("--max-long-partial-prefills", until=VLLM_V0_REMOVED, plugin=True),
        label="longpartial",
        tunable=True,
        bounds_note="tuned only where the engine honours it",
    ),
    KnobSpec(
        "enable_prefix_caching",
        "enablePrefixCaching",
        "bool",
        (
            "Reuse KV cache of shared prompt prefixes (--enable-prefix-caching); SGLang"
            " --disable-radix-cache when off, TensorRT-LLM kv_cache_config.enable_block_reuse."
        ),
        {
            **_vllm("--enable-prefix-caching"),
            **_flags(
                sglang="--disable-radix-cache", trtllm="kv_cache_config.enable_block_reuse", trtllm_yaml=True
            ),
        },
        default=True,
    ),
    KnobSpec(
        "speculative",
        "speculative",
        "json",
        "Speculative decoding (--speculative-config); off when unset.",
        _vllm("--speculative-config"),
    ),
    KnobSpec(
        "gpu_memory_utilization",
        "gpuMemoryUtilization",
        "float",
        (
            "Fraction of GPU memory the engine may use (--gpu-memory-utilization); SGLang"
            " --mem-fraction-static, TensorRT-LLM kv_cache_config.free_gpu_memory_fraction (of the"
            " memory free after the weights are loaded)."
        ),
        {
            **_vllm("--gpu-memory-utilization"),
            **_flags(
                sglang="--mem-fraction-static",
                trtllm="kv_cache_config.free_gpu_memory_fraction",
                trtllm_yaml=True,
            ),
        },
        default=0.92,
    ),
    KnobSpec(
        "tensor_parallel_size",
        "tensorParallelSize",
        "int",
        (
            "GPUs each replica shards the model over (--tensor-parallel-size); SGLang --tp-size,"
            " TensorRT-LLM --tp_size."
        ),
        {**_vllm("--tensor-parallel-size"), **_flags(sglang="--tp-size", trtllm="--tp_size")},
        default=1,
    ),
    KnobSpec(
        "max_prefill_tokens",
        "maxPrefillTokens",
        "int",
        (
            "SGLang only: maximum new prompt tokens in one prefill batch (--max-prefill-tokens; the"
            " engine's bound is the larger of this and the context length)."
        ),
        _flags(sglang="--max-prefill-tokens"),
    ),
    KnobSpec(
        "schedule_policy",
        "schedulePolicy",
        "enum",
        "SGLang only: order in which waiting requests are admitted (--schedule-policy).",
        _flags(sglang="--schedule-policy"),
    ),
    KnobSpec(
        "enable_mixed_chunk",
        "enableMixedChunk",
        "bool",
        (
            "SGLang only: run a prefill chunk and the running decodes in one forward pass"
            " (--enable-mixed-chunk); without it a chunk is its own pass and the decodes wait for it."
        ),
        _flags(sglang="--enable-mixed-chunk"),
        off=False,
        default=False,
    ),
    KnobSpec(
        "capacity_scheduler_policy",
        "capacitySchedulerPolicy",
        "enum",
        (
            "TensorRT-LLM only: how the capacity scheduler admits requests against the KV cache"
            " (options file scheduler_config.capacity_scheduler_policy)."
        ),
        _flags(trtllm="scheduler_config.capacity_scheduler_policy", trtllm_yaml=True),
    ),
    KnobSpec(
        "context_chunking_policy",
        "contextChunkingPolicy",
        "enum",
        (
            "TensorRT-LLM only: how the token budget is shared among chunked prompts"
            " (options file scheduler_config.context_chunking_policy)."
        ),
        _flags(trtllm="scheduler_config.context_chunking_policy", trtllm_yaml=True),
    ),
)

KNOB_BY_NAME: Final[Mapping[str, KnobSpec]] = {knob.name: knob for knob in KNOBS}
#: The knobs the autotuner searches, in table order: ``EngineConfig``'s fields and the Optuna parameters.
TUNABLE: Final[tuple[KnobSpec, ...]] = tuple(knob for knob in KNOBS if knob.tunable)
TUNABLE_NAMES: Final[tuple[str, ...]] = tuple(knob.name for knob in TUNABLE)
#: The knobs the live-adjustment route can lower without a restart.
LIVE_NAMES: Final[tuple[str, ...]] = tuple(knob.name for knob in KNOBS if knob.live)

#: Server flags rendered from other parts of the spec (model, port), per dialect: the dialect owner's
#: (:attr:`~chunkpilot.api.engines.EngineDescriptor.server_flags`). Aliases of managed flags are listed
#: too, so ``extraArgs`` cannot repeat a setting under another name.
SERVER_FLAGS: Final[Mapping[str, tuple[str, ...]]] = {d: dialect_owner(d).server_flags for d in DIALECTS}


def managed_flags(dialect: str = VLLM) -> tuple[str, ...]:
    """Flags (without dashes) rendered from the spec in ``dialect``; ``extraArgs`` may not repeat them."""
    knob_flags = (k.flag(dialect).name for k in KNOBS if dialect in k.flags and not k.flag(dialect).yaml)
    return tuple(dict.fromkeys((*SERVER_FLAGS[dialect], *knob_flags)))


#: The vLLM flags rendered from the spec.
MANAGED_FLAGS: Final[tuple[str, ...]] = managed_flags(VLLM)


def knob(name: str) -> KnobSpec:
    """The row of ``name`` (snake or camel case); KeyError naming the known knobs otherwise."""
    row = KNOB_BY_NAME.get(name) or next((k for k in KNOBS if k.camel == name), None)
    if row is None:
        raise KeyError(f"unknown knob {name!r}; known: {', '.join(KNOB_BY_NAME)}")
    return row


def doc(name: str) -> str:
    """CRD documentation of knob ``name``."""
    return knob(name).doc


def summary(values: Mapping[str, object]) -> str:
    """The short form of a configuration, e.g. ``budget=3072 seqs=256 lpt=512``.

    ``values`` maps tuned knob names to values; unset (or off) knobs are left out.
    """
    parts = [f"{k.label}={values[k.name]}" for k in TUNABLE if k.is_set(values.get(k.name))]
    return " ".join(parts)


def change(old: Mapping[str, object], new: Mapping[str, object]) -> str:
    """What differs between two configurations, e.g. ``maxNumBatchedTokens 8192 -> 3072``.

    ``old`` and ``new`` map tuned knob names to values; only the knobs that differ, in table
    order, by their camelCase names; empty when none does.
    """
    parts = [
        f"{k.camel} {old.get(k.name)} -> {new.get(k.name)}"
        for k in TUNABLE
        if old.get(k.name) != new.get(k.name)
    ]
    return ", ".join(parts)


def honoured_natively(name: str, version: EngineVersion, dialect: str = VLLM) -> bool:
    """Whether ``version`` of the engine family ``dialect`` accepts knob ``name`` without the plugin."""
    return knob(name).honoured_by(dialect, version)


def dialect_of(engine_kind: str) -> Dialect:
    """The flag dialect of an engine kind: the simulator speaks vLLM's."""
    descriptor = ENGINES.get(str(engine_kind))
    return Dialect(descriptor.dialect) if descriptor is not None else Dialect.VLLM


def engine_honours(engine_kind: str, name: str, version: EngineVersion) -> bool:
    """Whether ``version`` of an engine of ``engine_kind`` has a setting for knob ``name``.

    The knob table's judgement the renderers refuse by (``UnsupportedKnob``): the row has a
    flag in the kind's dialect (:func:`dialect_of`; the simulator's is vLLM's) and the
    flag's version range takes in ``version`` (natively, without the scheduler plugin).
    """
    return knob(name).honoured_by(dialect_of(engine_kind), version)


__all__ = [
    "DIALECTS",
    "ENGINE_NAMES",
    "KNOBS",
    "KNOB_BY_NAME",
    "LIVE_NAMES",
    "MANAGED_FLAGS",
    "SERVER_FLAGS",
    "SGLANG",
    "SGLANG_PINNED",
    "TRTLLM",
    "TRTLLM_PINNED",
    "TUNABLE",
    "TUNABLE_NAMES",
    "VLLM",
    "VLLM_0_33",
    "VLLM_V0_REMOVED",
    "CapacitySchedulerPolicy",
    "ContextChunkingPolicy",
    "Dialect",
    "EngineFlag",
    "EngineKind",
    "EngineVersion",
    "KnobSpec",
    "change",
    "dialect_of",
    "doc",
    "engine_honours",
    "honoured_natively",
    "knob",
    "managed_flags",
    "registered_kind",
    "summary",
]

"""The ``InferenceService`` custom resource: one LLM served with chunked prefill within SLOs."""

from __future__ import annotations

import functools
import hashlib
import json
import re
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    Field,
    GetJsonSchemaHandler,
    ModelWrapValidatorHandler,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError

from chunkpilot.api import options
from chunkpilot.api.common import (
    ApiModel,
    CelRule,
    Condition,
    Duration,
    Measurement,
    ObjectMeta,
    Resource,
    StatusModel,
    parse_duration,
)
from chunkpilot.api.engines import (
    DEFAULT_KIND,
    ENGINES,
    cel_list,
    dialect_owner,
    either,
    kind_field_doc,
    kind_is_not,
    kinds,
    version_field_doc,
)
from chunkpilot.api.knobs import DIALECTS, TUNABLE_NAMES, doc, knob, registered_kind
from chunkpilot.api.knobs import MANAGED_FLAGS as MANAGED_FLAGS  # re-exported for the tests
from chunkpilot.api.knobs import CapacitySchedulerPolicy as CapacitySchedulerPolicy  # the table's enums
from chunkpilot.api.knobs import ContextChunkingPolicy as ContextChunkingPolicy
from chunkpilot.api.knobs import EngineKind as EngineKind
from chunkpilot.api.knobs import summary as knob_summary
from chunkpilot.api.scaling import ScalingSpec, ScalingStatus

# --------------------------------------------------------------------------- enums


#: The engine version rendered when ``spec.engine.version`` is unset, per kind (the registry's; the
#: simulator speaks the vLLM release's command line).
DEFAULT_ENGINE_VERSIONS: dict[str, str] = {e.kind: e.default_version for e in ENGINES.values()}


class _RegisteredKinds:
    """The JSON schema of a kind field: a string, one of the registered kinds (the CRD's enum)."""

    def __get_pydantic_json_schema__(
        self, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        schema: dict[str, Any] = handler(core_schema)
        return {**schema, "enum": list(ENGINES)}


#: ``spec.engine.kind``: a registered engine kind (:data:`~chunkpilot.api.engines.ENGINES`).
EngineKindName = Annotated[str, AfterValidator(registered_kind), _RegisteredKinds()]


def _default(name: str) -> Any:
    """``spec.engine.<name>``'s default: the knob table's."""
    return knob(name).default


def _default_version(kind: str) -> str:
    """The default version of ``kind`` (the default kind's for an unknown one, which validation refuses)."""
    return ENGINES.get(kind, ENGINES[DEFAULT_KIND]).default_version


class SchedulePolicy(StrEnum):
    """SGLang ``--schedule-policy``: the order waiting requests are admitted in."""

    FCFS = "fcfs"
    LPM = "lpm"
    RANDOM = "random"
    DFS_WEIGHT = "dfs-weight"
    LOF = "lof"


class Accelerator(StrEnum):
    """GPU type: a node-selection hint and the simulator's hardware profile.

    The members are the accelerator profiles that name a GPU product (``chunkpilot.api.accelerators``),
    declared one by one so that ``Accelerator.H100`` type-checks; ``tests/api/test_accelerators.py``
    proves the two agree.
    """

    A100_40GB = "a100-40gb"
    A100_80GB = "a100-80gb"
    H100 = "h100"
    H200 = "h200"
    L40S = "l40s"
    B200 = "b200"


class SpeculativeMethod(StrEnum):
    """Speculative decoding method (vLLM ``--speculative-config`` ``method``)."""

    NGRAM = "ngram"
    DRAFT_MODEL = "draft_model"
    EAGLE = "eagle"
    EAGLE3 = "eagle3"
    MTP = "mtp"


#: Methods that need a separate draft model (``draftModel``).
DRAFT_METHODS = (SpeculativeMethod.DRAFT_MODEL, SpeculativeMethod.EAGLE, SpeculativeMethod.EAGLE3)
#: The UID Chunkpilot's pods run as by default (``spec.engine.runAsUser``): non-root, the "nonroot"
#: user of distroless images, which the Chunkpilot images run as too.
NON_ROOT_UID = 65532


class Objective(StrEnum):
    """What the autotuner maximises, subject to the SLOs."""

    THROUGHPUT = "throughput"
    GOODPUT = "goodput"


class SamplerKind(StrEnum):
    """Optuna sampler used by the autotuner."""

    TPE = "tpe"
    GP = "gp"


class TolerationOperator(StrEnum):
    """Kubernetes toleration operator."""

    EXISTS = "Exists"
    EQUAL = "Equal"


class TaintEffect(StrEnum):
    """Kubernetes taint effect."""

    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


class ServicePhase(StrEnum):
    """Coarse lifecycle phase of an InferenceService."""

    PENDING = "Pending"
    DEPLOYING = "Deploying"
    READY = "Ready"
    TUNING = "Tuning"
    DEGRADED = "Degraded"
    FAILED = "Failed"


class SLOState(StrEnum):
    """Whether the last measurement met the SLOs."""

    MET = "Met"
    VIOLATED = "Violated"
    UNKNOWN = "Unknown"


# --------------------------------------------------------------------------- knob rules (spec and config)

_BUDGET_GE_SEQS = CelRule(
    rule="self.maxNumBatchedTokens >= self.maxNumSeqs",
    message="maxNumBatchedTokens must be >= maxNumSeqs: raise maxNumBatchedTokens or lower maxNumSeqs",
    field_path=".maxNumBatchedTokens",
    check=lambda o: o.max_num_batched_tokens >= o.max_num_seqs,
)

_ACTIVE_LE_SEQS = CelRule(
    rule="!has(self.maxNumActiveSeqs) || self.maxNumActiveSeqs <= self.maxNumSeqs",
    message="maxNumActiveSeqs must be <= maxNumSeqs: lower maxNumActiveSeqs or leave it unset",
    field_path=".maxNumActiveSeqs",
    check=lambda o: o.max_num_active_seqs is None or o.max_num_active_seqs <= o.max_num_seqs,
)

_LONG_PARTIAL_NEEDS_PARTIAL = CelRule(
    rule="!has(self.maxLongPartialPrefills) || has(self.maxNumPartialPrefills)",
    message="maxLongPartialPrefills requires maxNumPartialPrefills: set maxNumPartialPrefills as well",
    field_path=".maxLongPartialPrefills",
    check=lambda o: o.max_long_partial_prefills is None or o.max_num_partial_prefills is not None,
)

_LONG_PARTIAL_LE_PARTIAL = CelRule(
    rule=(
        "!has(self.maxLongPartialPrefills) || !has(self.maxNumPartialPrefills)"
        " || self.maxLongPartialPrefills <= self.maxNumPartialPrefills"
    ),
    message="maxLongPartialPrefills must be <= maxNumPartialPrefills: lower maxLongPartialPrefills",
    field_path=".maxLongPartialPrefills",
    check=lambda o: (
        o.max_long_partial_prefills is None
        or o.max_num_partial_prefills is None
        or o.max_long_partial_prefills <= o.max_num_partial_prefills
    ),
)

_KNOB_RULES = (_BUDGET_GE_SEQS, _ACTIVE_LE_SEQS, _LONG_PARTIAL_NEEDS_PARTIAL, _LONG_PARTIAL_LE_PARTIAL)


def _managed_flag_pattern(dialect: str) -> str:
    """RE2: every exact spelling of a guarded option of ``dialect``, ``_`` for ``-`` where it parses so.

    Abbreviations are the operator's to find (:func:`chunkpilot.api.options.extra_args_problems`).
    """
    rules = options.table(dialect)
    spellings = options.guarded_spellings(dialect)
    if rules.underscores_are_dashes:
        spellings = tuple(s[:2] + s[2:].replace("-", "[-_]") if s.startswith("--") else s for s in spellings)
    tail = "([=.].*)?" if rules.sub_options else "(=.*)?"
    return "^(" + "|".join(spellings) + ")" + tail + "$"


def _repeats_no_managed_flag(spec: EngineSpec, dialect: str, pattern: re.Pattern[str]) -> bool:
    """Whether ``spec``, when its kind speaks ``dialect``, repeats none of that dialect's managed flags."""
    speaks = spec.kind in ENGINES and ENGINES[spec.kind].dialect == dialect
    return not speaks or not any(pattern.match(arg) for arg in spec.extra_args)


def _managed_flag_rules() -> tuple[CelRule, ...]:
    """Per dialect of the registry: ``extraArgs`` of a kind speaking it may not repeat its managed flags.

    The default kind's dialect is guarded by the kinds that speak another one; each other dialect by
    the kinds that speak it.
    """
    default = ENGINES[DEFAULT_KIND].dialect
    rules = []
    for dialect in DIALECTS:
        pattern = _managed_flag_pattern(dialect)
        speakers = tuple(e.kind for e in ENGINES.values() if e.dialect == dialect)
        if dialect == default:
            guard = f"self.kind in {cel_list(k for k in ENGINES if k not in speakers)}"
            flags = "flags"
        else:
            guard = kind_is_not("self.kind", speakers)
            flags = f"{dialect_owner(dialect).command_line} flags"
        example = knob("max_num_batched_tokens").flag(dialect).flag
        rules.append(
            CelRule(
                rule=f"{guard} || self.extraArgs.all(a, !a.matches('{pattern}'))",
                message=(
                    f"extraArgs must not repeat {flags} rendered from the spec (e.g. {example}):"
                    " set the corresponding spec.engine field instead"
                ),
                field_path=".extraArgs",
                check=functools.partial(
                    _repeats_no_managed_flag, dialect=dialect, pattern=re.compile(pattern)
                ),
            )
        )
    return tuple(rules)


# --------------------------------------------------------------------------- spec


class SecretKeyRef(ApiModel):
    """A key in a Secret in the service's namespace."""

    name: str = Field(min_length=1, max_length=253, description="Secret name.")
    key: str = Field(default="token", min_length=1, max_length=253, description="Key within the Secret.")


class ModelSpec(ApiModel):
    """Which model to serve."""

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            rule="!self.name.contains('://') || self.name.matches('^(hf|s3|gs|pvc)://[^/]+')",
            message=(
                "name must be a Hugging Face repo id (org/model), a simulator profile name, or a URI"
                " with scheme hf://, s3://, gs:// or pvc://"
            ),
            field_path=".name",
            check=lambda o: "://" not in o.name or re.match(r"^(hf|s3|gs|pvc)://[^/]+", o.name) is not None,
        ),
        CelRule(
            rule="!self.name.startsWith('-')",
            message=(
                "name must not start with '-': the engine would read it as a flag; give the model's repo"
                " id, URI or profile name"
            ),
            field_path=".name",
            check=lambda o: not o.name.startswith("-"),
        ),
    )

    name: str = Field(
        min_length=1,
        max_length=512,
        description=(
            "Model to load: a Hugging Face repo id (meta-llama/Llama-3.1-8B-Instruct), a URI"
            " (hf://, s3://, gs://, pvc://), or for engine kind sim a simulator profile name."
        ),
    )
    served_name: str | None = Field(
        default=None, max_length=256, description="Name clients use in requests (--served-model-name)."
    )
    revision: str | None = Field(
        default=None, max_length=256, description="Model revision: branch, tag or commit (--revision)."
    )
    max_model_len: int | None = Field(
        default=None,
        ge=16,
        le=4_194_304,
        description="Maximum context length in tokens (--max-model-len); the model's own limit when unset.",
    )
    token_secret_ref: SecretKeyRef | None = Field(
        default=None, description="Secret holding a Hugging Face token; exposed to the engine as HF_TOKEN."
    )


class SpeculativeSpec(ApiModel):
    """Speculative decoding (vLLM --speculative-config)."""

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            rule="!(self.method in ['draft_model', 'eagle', 'eagle3']) || has(self.draftModel)",
            message="draftModel is required when method is draft_model, eagle or eagle3: set draftModel",
            field_path=".draftModel",
            check=lambda o: o.method not in DRAFT_METHODS or o.draft_model is not None,
        ),
        CelRule(
            rule="!(self.method in ['ngram', 'mtp']) || !has(self.draftModel)",
            message=(
                "draftModel is only used by draft_model, eagle and eagle3: remove draftModel or change method"
            ),
            field_path=".draftModel",
            check=lambda o: o.method in DRAFT_METHODS or o.draft_model is None,
        ),
    )

    method: SpeculativeMethod = Field(
        default=SpeculativeMethod.NGRAM,
        description="Proposal method: ngram, draft_model, eagle, eagle3 or mtp.",
    )
    num_speculative_tokens: int = Field(
        default=4,
        ge=1,
        le=16,
        description="Tokens proposed per step (k); each running sequence then uses 1+k budget tokens.",
    )
    draft_model: str | None = Field(
        default=None,
        min_length=1,
        max_length=512,
        description="Draft model repo id or URI; required for draft_model, eagle and eagle3.",
    )


_ADDITIONAL_CONFIG = "--additional-config"


def _additional_configs_are_objects(args: list[str]) -> bool:
    """Whether every ``--additional-config`` value in ``args`` is a JSON object (the engine merges it)."""
    for index, arg in enumerate(args):
        if arg.startswith(_ADDITIONAL_CONFIG + "="):
            value = arg.partition("=")[2]
        elif arg == _ADDITIONAL_CONFIG:
            value = args[index + 1] if index + 1 < len(args) else ""
        else:
            continue
        try:
            parsed = json.loads(value)
        except ValueError:
            return False
        if not isinstance(parsed, dict):
            return False
    return True


class EngineSpec(ApiModel):
    """Engine and scheduler settings; see the vLLM flag of the same name."""

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        *_KNOB_RULES,
        CelRule(
            rule=(
                "!has(self.extraArgs) || self.extraArgs.all(a, !a.startsWith('--additional-config=') "
                "|| a.matches('^--additional-config=[{].*[}]$'))"
            ),
            message=(
                "extraArgs: the value of --additional-config must be a JSON object, e.g."
                ' --additional-config={"key": "value"}'
            ),
            field_path=".extraArgs",
            check=lambda o: _additional_configs_are_objects(o.extra_args),
        ),
        CelRule(
            rule=f"!has(self.pluginInstalled) || self.kind in {cel_list(kinds(where='plugin'))}",
            message=(
                f"pluginInstalled applies to kind {either(kinds(where='plugin'))} only (Chunkpilot's"
                " scheduler plugin is vLLM's): remove it"
            ),
            field_path=".pluginInstalled",
            check=lambda o: o.plugin_installed is None or str(o.kind) in kinds(where="plugin"),
        ),
        CelRule(
            rule=(
                "!has(self.speculative) || self.maxNumBatchedTokens >= "
                "self.maxNumSeqs * (1 + self.speculative.numSpeculativeTokens)"
            ),
            message=(
                "maxNumBatchedTokens must be >= maxNumSeqs * (1 + speculative.numSpeculativeTokens):"
                " raise maxNumBatchedTokens, lower maxNumSeqs or numSpeculativeTokens"
            ),
            field_path=".maxNumBatchedTokens",
            check=lambda o: (
                o.speculative is None
                or o.max_num_batched_tokens >= o.max_num_seqs * (1 + o.speculative.num_speculative_tokens)
            ),
        ),
        CelRule(
            rule=(
                "!has(self.maxNumPartialPrefills) || self.maxNumPartialPrefills <= 1"
                " || self.enableChunkedPrefill"
            ),
            message="maxNumPartialPrefills > 1 requires enableChunkedPrefill: true",
            field_path=".maxNumPartialPrefills",
            check=lambda o: (
                o.max_num_partial_prefills is None
                or o.max_num_partial_prefills <= 1
                or o.enable_chunked_prefill
            ),
        ),
        *_managed_flag_rules(),
        CelRule(
            rule="!self.enableMixedChunk || self.enableChunkedPrefill",
            message=(
                "enableMixedChunk requires enableChunkedPrefill: true (SGLang mixes prefill chunks into"
                " decode batches only with chunked prefill on)"
            ),
            field_path=".enableMixedChunk",
            check=lambda o: not o.enable_mixed_chunk or o.enable_chunked_prefill,
        ),
        CelRule(
            rule=(
                "!has(self.maxPrefillTokens) || !self.enableChunkedPrefill"
                " || self.maxNumBatchedTokens <= self.maxPrefillTokens"
            ),
            message=(
                "maxNumBatchedTokens (SGLang --chunked-prefill-size) must be <= maxPrefillTokens: a chunk"
                " larger than the prefill batch bound never runs whole; lower the budget or raise"
                " maxPrefillTokens"
            ),
            field_path=".maxNumBatchedTokens",
            check=lambda o: (
                o.max_prefill_tokens is None
                or not o.enable_chunked_prefill
                or o.max_num_batched_tokens <= o.max_prefill_tokens
            ),
        ),
    )

    kind: EngineKindName = Field(default=EngineKind(DEFAULT_KIND), description=kind_field_doc())
    image: str | None = Field(
        default=None,
        max_length=512,
        description="Container image; the operator's default for kind and version.",
    )
    plugin_installed: bool | None = Field(
        default=None,
        description=(
            "vLLM only: the image has Chunkpilot's vLLM plugin installed (a team's own vLLM image with"
            " the lines of docs/vllm-plugin.md added), so it is run exactly like Chunkpilot's engine image:"
            " partial-prefill lanes, live adjustment and step telemetry for the twin. Unset: only"
            " Chunkpilot's engine image (from any registry) counts as having it; false: never."
        ),
    )
    version: str = Field(
        default_factory=lambda data: _default_version(str(data.get("kind", DEFAULT_KIND))),
        max_length=64,
        pattern=r"^v?[0-9]+\.[0-9]+(\.[0-9]+)?([-+.][0-9A-Za-z.-]+)?$",
        description=version_field_doc(),
    )
    max_num_batched_tokens: int = Field(
        default=_default("max_num_batched_tokens"),
        ge=1,
        le=1_048_576,
        description=doc("max_num_batched_tokens"),
    )
    max_num_seqs: int = Field(
        default=_default("max_num_seqs"), ge=1, le=65_536, description=doc("max_num_seqs")
    )
    max_num_active_seqs: int | None = Field(
        default=None,
        ge=1,
        le=65_536,
        description=doc("max_num_active_seqs"),
    )
    enable_chunked_prefill: bool = Field(
        default=_default("enable_chunked_prefill"), description=doc("enable_chunked_prefill")
    )
    long_prefill_token_threshold: int = Field(
        default=_default("long_prefill_token_threshold"),
        ge=0,
        le=4_194_304,
        description=doc("long_prefill_token_threshold"),
    )
    long_prefill_token_threshold_adaptive: bool = Field(
        default=_default("long_prefill_token_threshold_adaptive"),
        description=doc("long_prefill_token_threshold_adaptive"),
    )
    max_num_partial_prefills: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description=doc("max_num_partial_prefills"),
    )
    max_long_partial_prefills: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description=doc("max_long_partial_prefills"),
    )
    enable_prefix_caching: bool = Field(
        default=_default("enable_prefix_caching"), description=doc("enable_prefix_caching")
    )
    speculative: SpeculativeSpec | None = Field(default=None, description=doc("speculative"))
    gpu_memory_utilization: float = Field(
        default=_default("gpu_memory_utilization"),
        gt=0,
        le=1,
        description=doc("gpu_memory_utilization"),
    )
    tensor_parallel_size: int = Field(
        default=_default("tensor_parallel_size"),
        ge=1,
        le=64,
        description=doc("tensor_parallel_size"),
    )
    max_prefill_tokens: int | None = Field(
        default=None, ge=1, le=4_194_304, description=doc("max_prefill_tokens")
    )
    schedule_policy: SchedulePolicy | None = Field(default=None, description=doc("schedule_policy"))
    enable_mixed_chunk: bool = Field(
        default=_default("enable_mixed_chunk"), description=doc("enable_mixed_chunk")
    )
    capacity_scheduler_policy: CapacitySchedulerPolicy | None = Field(
        default=None, description=doc("capacity_scheduler_policy")
    )
    context_chunking_policy: ContextChunkingPolicy | None = Field(
        default=None, description=doc("context_chunking_policy")
    )
    extra_args: list[Annotated[str, Field(max_length=512)]] = Field(
        default_factory=list,
        max_length=64,
        description=(
            "Further engine flags passed through verbatim, after the managed ones. A token the engine"
            " would read as an option the spec renders (under any spelling its parser accepts:"
            " abbreviations, _ for -, short aliases, JSON sub-options) or as one that overrides its"
            " scheduling limits is refused; set the spec field instead."
        ),
    )
    run_as_user: int = Field(
        default=NON_ROOT_UID,
        ge=0,
        le=2_147_483_647,
        description=(
            "UID the engine containers run as. The default, a non-root UID with no privileges, keeps the "
            "engine pods within the 'restricted' Pod Security profile (HOME and caches on emptyDirs). "
            "0 runs an image that needs root as root, outside that profile: a namespace that enforces "
            "it refuses such pods."
        ),
    )

    @model_validator(mode="after")
    def _extra_args_leave_managed_options_alone(self) -> EngineSpec:
        """The authoritative check the CEL rule approximates: ``extraArgs`` read by the engine's own
        parser rules (abbreviations, ``_`` for ``-``, short aliases, JSON sub-options) set no option the
        spec manages (:func:`chunkpilot.api.options.extra_args_problems`)."""
        problems = options.extra_args_problems(self.kind, self.extra_args)
        if problems:
            raise PydanticCustomError(
                "extra_args", "{message}", {"message": "; ".join(problems), "field_path": ".extraArgs"}
            )
        return self

    #: The version was not given: it is the kind's default, and left out of dumps (as the apiserver,
    #: which has no per-kind default, leaves it out of the stored object).
    _version_defaulted: bool = PrivateAttr(default=False)

    @model_validator(mode="wrap")
    @classmethod
    def _default_version_of_kind(
        cls, data: Any, handler: ModelWrapValidatorHandler[EngineSpec]
    ) -> EngineSpec:
        """An unset version is the default of the engine kind (vLLM's for an unknown kind)."""
        defaulted = isinstance(data, dict) and data.get("version") is None
        if defaulted:
            data = {**data, "version": _default_version(str(data.get("kind", DEFAULT_KIND)))}
        spec = handler(data)
        spec._version_defaulted = defaulted
        return spec

    @model_serializer(mode="wrap")
    def _without_a_defaulted_version(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if self._version_defaulted and isinstance(data, dict):
            data.pop("version", None)
        return data


class Toleration(ApiModel):
    """A Kubernetes pod toleration."""

    key: str | None = Field(default=None, max_length=316, description="Taint key; empty matches all keys.")
    operator: TolerationOperator | None = Field(default=None, description="Exists or Equal (default Equal).")
    value: str | None = Field(default=None, max_length=63, description="Taint value for operator Equal.")
    effect: TaintEffect | None = Field(default=None, description="Taint effect to match; empty matches all.")
    toleration_seconds: int | None = Field(
        default=None, description="For NoExecute: how long the pod stays bound after the taint appears."
    )


class ResourcesSpec(ApiModel):
    """GPUs and placement of each replica."""

    accelerator: Accelerator = Field(
        default=Accelerator.H100,
        description="GPU type: node-selection hint and simulator hardware profile.",
    )
    gpus_per_replica: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="nvidia.com/gpu per replica; defaults to and must equal engine.tensorParallelSize.",
    )
    node_selector: dict[str, Annotated[str, Field(max_length=63)]] = Field(
        default_factory=dict,
        max_length=64,
        description="Node labels the engine pods must match.",
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=32, description="Tolerations of the engine pods."
    )


class LatencyObjective(ApiModel):
    """A latency target: the given quantile must stay at or below maxMs."""

    quantile: float = Field(default=0.99, gt=0, lt=1, description="Quantile in (0, 1), e.g. 0.99 for p99.")
    max_ms: float = Field(gt=0, le=3_600_000, description="Maximum latency at that quantile, milliseconds.")


class SLOSpec(ApiModel):
    """Latency service-level objectives the service (and the autotuner) must meet."""

    itl: LatencyObjective = Field(description="Inter-token latency objective.")
    ttft: LatencyObjective = Field(description="Time-to-first-token objective.")
    window: Duration = Field(default="5m", description="Window over which quantiles are measured, e.g. 5m.")


class IntRange(ApiModel):
    """An inclusive integer range."""

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            rule="self.min <= self.max",
            message="min must be <= max: swap or correct the bounds",
            field_path=".min",
            check=lambda o: o.min <= o.max,
        ),
    )

    min: int = Field(ge=0, le=4_194_304, description="Lower bound (inclusive).")
    max: int = Field(ge=0, le=4_194_304, description="Upper bound (inclusive).")


def _bounds_doc(name: str) -> str:
    return knob(name).bounds_doc


class TuningBounds(ApiModel):
    """Overrides of the autotuner's search space; unset knobs use the built-in bounds."""

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            rule="!has(self.maxNumBatchedTokens) || self.maxNumBatchedTokens.min >= 1",
            message="maxNumBatchedTokens.min must be >= 1: raise the lower bound",
            field_path=".maxNumBatchedTokens.min",
            check=lambda o: o.max_num_batched_tokens is None or o.max_num_batched_tokens.min >= 1,
        ),
        CelRule(
            rule="!has(self.maxNumSeqs) || self.maxNumSeqs.min >= 1",
            message="maxNumSeqs.min must be >= 1: raise the lower bound",
            field_path=".maxNumSeqs.min",
            check=lambda o: o.max_num_seqs is None or o.max_num_seqs.min >= 1,
        ),
    )

    # One field per tuned knob of the knob table (chunkpilot.api.knobs), in its order.
    max_num_batched_tokens: IntRange | None = Field(
        default=None, description=_bounds_doc("max_num_batched_tokens")
    )
    max_num_seqs: IntRange | None = Field(default=None, description=_bounds_doc("max_num_seqs"))
    max_num_active_seqs: IntRange | None = Field(default=None, description=_bounds_doc("max_num_active_seqs"))
    long_prefill_token_threshold: IntRange | None = Field(
        default=None, description=_bounds_doc("long_prefill_token_threshold")
    )
    max_num_partial_prefills: IntRange | None = Field(
        default=None, description=_bounds_doc("max_num_partial_prefills")
    )
    max_long_partial_prefills: IntRange | None = Field(
        default=None, description=_bounds_doc("max_long_partial_prefills")
    )


class AbortPolicy(ApiModel):
    """When a canary is aborted early: a latency quantile above factor x target with enough samples."""

    itl_factor: float = Field(
        default=2.0, ge=1, le=100, description="Abort when canary ITL > factor x target."
    )
    ttft_factor: float = Field(
        default=2.0, ge=1, le=100, description="Abort when canary TTFT > factor x target."
    )
    min_samples: int = Field(
        default=100, ge=1, le=1_000_000, description="Requests the canary must have served before aborting."
    )


_DURATION_RE_CEL = "^[0-9]+(s|m|h)$"


def _valid_durations(*values: str) -> bool:
    try:
        for value in values:
            parse_duration(value)
    except ValueError:
        return False
    return True


class AutotuneSpec(ApiModel):
    """Online tuning of the scheduler knobs against the SLOs."""

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            rule=(
                f"!self.warmup.matches('{_DURATION_RE_CEL}')"
                f" || !self.trialWindow.matches('{_DURATION_RE_CEL}')"
                " || duration(self.warmup) < duration(self.trialWindow)"
            ),
            message="warmup must be shorter than trialWindow: lower warmup or raise trialWindow",
            field_path=".warmup",
            check=lambda o: (
                not _valid_durations(o.warmup, o.trial_window)
                or parse_duration(o.warmup) < parse_duration(o.trial_window)
            ),
        ),
    )

    enabled: bool = Field(default=False, description="Run the autotuner for this service.")
    paused: bool = Field(default=False, description="Keep the current config; start no new trials.")
    objective: Objective = Field(
        default=Objective.THROUGHPUT,
        description="Maximise throughput (tokens/s per GPU) or goodput (requests/s per GPU within both SLOs)",
    )
    sampler: SamplerKind = Field(default=SamplerKind.TPE, description="Optuna sampler: tpe or gp.")
    trial_window: Duration = Field(default="5m", description="How long each trial's canary is measured.")
    warmup: Duration = Field(
        default="60s", description="Time after a canary is ready before measuring starts."
    )
    max_trials: int = Field(default=20, ge=1, le=1000, description="Trials per tuning run.")
    canary_replicas: int = Field(
        default=1, ge=1, le=64, description="Extra replicas running the trial config (on top of replicas)."
    )
    live_adjust: bool = Field(
        default=False,
        description="Lower scheduler limits at runtime without a restart where the engine allows it.",
    )
    bounds: TuningBounds | None = Field(default=None, description="Search-space overrides.")
    abort: AbortPolicy = Field(
        default_factory=AbortPolicy, description="Early-abort thresholds for canaries."
    )
    allow_topology_change: bool = Field(
        default=False,
        description=(
            "Let the tuner roll out the prefill/decode topology it recommends once colocated tuning is"
            " SLOInfeasible (status.recommendation with meetsSlo) as a canary topology: canary prefill and"
            " decode pools and a canary router taking a share of the traffic, measured and then promoted"
            " (status.bestTopology: the operator runs the pools and the router and removes the colocated"
            " Deployment) or rolled back, recorded in a TuningTrial. Only a layout of spec.replicas GPUs is"
            " rolled out (a 1-replica service's 1 + 1 needs spec.replicas 2); spec.topology, when set,"
            " wins. In scaling.mode Auto the capacity planner's proposal is tried the same way: pools"
            " beside colocated replicas, or colocated replicas beside pools a topology trial promoted."
        ),
    )


# --------------------------------------------------------------------------- topology


class TopologyMode(StrEnum):
    """How a service's engines are laid out."""

    COLOCATED = "colocated"  # every replica runs prefill and decode (chunked prefill)
    DISAGGREGATED = "disaggregated"  # separate prefill and decode pools, KV shipped between them


class PoolRole(StrEnum):
    """The role of an engine pool of a disaggregated service (pod label ``chunkpilot.io/role``)."""

    PREFILL = "prefill"
    DECODE = "decode"


class KVConnector(StrEnum):
    """vLLM KV-transfer connector (``--kv-transfer-config`` ``kv_connector``)."""

    NIXL = "NixlConnector"


class RouterPolicy(StrEnum):
    """vllm-router ``--policy``: how a request picks its prefill and decode engines."""

    RANDOM = "random"
    ROUND_ROBIN = "round_robin"
    CACHE_AWARE = "cache_aware"
    KV_AWARE = "kv_aware"
    POWER_OF_TWO = "power_of_two"
    CONSISTENT_HASH = "consistent_hash"
    STICKY_LEAST_LOADED = "sticky_least_loaded"


#: First vLLM release shipping the NIXL KV connector (``NixlConnector``); the simulator, which
#: speaks that release's flags, follows it.
KV_CONNECTOR_SINCE = "0.9.0"
#: Versions older than :data:`KV_CONNECTOR_SINCE`, as a pattern over ``spec.engine.version``.
_BEFORE_KV_CONNECTOR = "^v?0[.][0-8]([^0-9]|$)"
_BEFORE_KV_CONNECTOR_RE = re.compile(_BEFORE_KV_CONNECTOR)


class PoolSpec(ApiModel):
    """One engine pool of a disaggregated service: its replicas and its own scheduler knobs.

    The knobs are the tuned knobs of ``spec.engine`` (:class:`EngineConfig`), under the same
    names; an unset knob is the one in ``spec.engine``.
    """

    replicas: int = Field(ge=1, le=1000, description="Engine replicas of this pool.")
    max_num_batched_tokens: int | None = Field(
        default=None, ge=1, le=1_048_576, description=doc("max_num_batched_tokens")
    )
    max_num_seqs: int | None = Field(default=None, ge=1, le=65_536, description=doc("max_num_seqs"))
    max_num_active_seqs: int | None = Field(
        default=None, ge=1, le=65_536, description=doc("max_num_active_seqs")
    )
    long_prefill_token_threshold: int | None = Field(
        default=None, ge=0, le=4_194_304, description=doc("long_prefill_token_threshold")
    )
    max_num_partial_prefills: int | None = Field(
        default=None, ge=1, le=1024, description=doc("max_num_partial_prefills")
    )
    max_long_partial_prefills: int | None = Field(
        default=None, ge=1, le=1024, description=doc("max_long_partial_prefills")
    )

    def knobs(self) -> dict[str, Any]:
        """The knobs this pool sets (snake_case), leaving out the ones it inherits."""
        return {name: getattr(self, name) for name in TUNABLE_NAMES if getattr(self, name) is not None}


class KVTransferSpec(ApiModel):
    """How the KV cache moves from a prefill engine to a decode engine."""

    connector: KVConnector = Field(
        default=KVConnector.NIXL, description="vLLM KV-transfer connector: NixlConnector (NIXL)."
    )
    bandwidth_gbps: float = Field(
        default=25.0,
        alias="bandwidthGBps",
        gt=0,
        le=100_000,
        description=(
            "KV transfer bandwidth per replica, GB/s: a hint for the twin and the simulator"
            " (a request's KV bytes / bandwidth + latency is its transfer time)."
        ),
    )
    latency_ms: float = Field(
        default=1.0, ge=0, le=60_000, description="Fixed latency of one KV transfer, milliseconds (a hint)."
    )


class RouterSpec(ApiModel):
    """The prefill/decode-aware router in front of the pools (vllm-router)."""

    image: str | None = Field(
        default=None,
        max_length=512,
        description="Router image (runs vllm-router); the operator's default: the Chunkpilot image.",
    )
    policy: RouterPolicy = Field(
        default=RouterPolicy.CACHE_AWARE,
        description="vllm-router --policy for both pools: " + ", ".join(p.value for p in RouterPolicy) + ".",
    )
    replicas: int = Field(default=1, ge=1, le=64, description="Router replicas.")


class TopologySpec(ApiModel):
    """Colocated (every replica prefills and decodes) or disaggregated prefill and decode pools."""

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            rule="self.mode != 'disaggregated' || (has(self.prefill) && has(self.decode))",
            message=(
                "topology.mode disaggregated needs both pools: set topology.prefill.replicas and"
                " topology.decode.replicas (each >= 1)"
            ),
            field_path=".mode",
            check=lambda o: (
                o.mode != TopologyMode.DISAGGREGATED or (o.prefill is not None and o.decode is not None)
            ),
        ),
        CelRule(
            rule="self.mode != 'colocated' || (!has(self.prefill) && !has(self.decode))",
            message=(
                "topology.prefill and topology.decode are only used with mode disaggregated: remove them"
                " or set topology.mode: disaggregated"
            ),
            field_path=".mode",
            check=lambda o: o.mode != TopologyMode.COLOCATED or (o.prefill is None and o.decode is None),
        ),
    )

    mode: TopologyMode = Field(
        default=TopologyMode.COLOCATED,
        description="colocated (default: chunked prefill on every replica) or disaggregated (two pools).",
    )
    prefill: PoolSpec | None = Field(default=None, description="The prefill pool (mode disaggregated).")
    decode: PoolSpec | None = Field(default=None, description="The decode pool (mode disaggregated).")
    kv_transfer: KVTransferSpec | None = Field(
        default=None,
        description=(
            "KV transfer between the pools; its hints are also what the tuner's topology recommendation"
            " assumes for a colocated service."
        ),
    )
    router: RouterSpec | None = Field(default=None, description="The router in front of the pools.")

    def pool(self, role: PoolRole | str) -> PoolSpec | None:
        """The pool of ``role``."""
        return self.prefill if PoolRole(role) == PoolRole.PREFILL else self.decode


def _disaggregated(o: Any) -> bool:
    return o.topology is not None and o.topology.mode == TopologyMode.DISAGGREGATED


def _pool_knob(o: Any, role: PoolRole, name: str) -> Any:
    pool = o.topology.pool(role) if _disaggregated(o) else None
    value = getattr(pool, name) if pool is not None else None
    return value if value is not None else getattr(o.engine, name)


def _pool_budget_covers_seqs(o: Any, role: PoolRole) -> bool:
    if not _disaggregated(o) or o.topology.pool(role) is None:
        return True
    return bool(_pool_knob(o, role, "max_num_batched_tokens") >= _pool_knob(o, role, "max_num_seqs"))


def _pool_active_within_seqs(o: Any, role: PoolRole) -> bool:
    if not _disaggregated(o) or o.topology.pool(role) is None:
        return True
    active = _pool_knob(o, role, "max_num_active_seqs")
    return active is None or bool(active <= _pool_knob(o, role, "max_num_seqs"))


def _pool_rules() -> tuple[CelRule, ...]:
    """Per pool: the knob rules vLLM enforces, over the pool's knobs and the inherited ones."""
    rules = []
    for role in PoolRole:
        path = f"self.topology.{role.value}"

        def cel(camel: str, path: str = path) -> str:
            return f"(has({path}.{camel}) ? {path}.{camel} : self.engine.{camel})"

        guard = f"!has(self.topology) || self.topology.mode != 'disaggregated' || !has({path})"
        rules.append(
            CelRule(
                rule=f"{guard} || {cel('maxNumBatchedTokens')} >= {cel('maxNumSeqs')}",
                message=(
                    f"topology.{role.value}: maxNumBatchedTokens must be >= maxNumSeqs (a pool's unset knobs"
                    " are spec.engine's): raise the pool's maxNumBatchedTokens or lower its maxNumSeqs"
                ),
                field_path=f".topology.{role.value}",
                check=functools.partial(_pool_budget_covers_seqs, role=role),
            )
        )
        active = (
            f"!has({path}.maxNumActiveSeqs) && !has(self.engine.maxNumActiveSeqs)"
            f" || {cel('maxNumActiveSeqs')} <= {cel('maxNumSeqs')}"
        )
        rules.append(
            CelRule(
                rule=f"{guard} || {active}",
                message=(
                    f"topology.{role.value}: maxNumActiveSeqs must be <= maxNumSeqs (a pool's unset knobs are"
                    " spec.engine's): lower the pool's maxNumActiveSeqs or raise its maxNumSeqs"
                ),
                field_path=f".topology.{role.value}",
                check=functools.partial(_pool_active_within_seqs, role=role),
            )
        )
    return tuple(rules)


_KV_TRANSFER_FLAG_PATTERN = "^--kv-transfer-config(=.*)?$"
_KV_TRANSFER_FLAG_RE = re.compile(_KV_TRANSFER_FLAG_PATTERN)

#: The kinds Chunkpilot renders prefill/decode disaggregation for (the registry's capability).
_DISAGGREGATING = kinds(where="disaggregation")


def _disaggregates(kind: str) -> bool:
    return kind in ENGINES and ENGINES[kind].disaggregation


_TOPOLOGY_RULES: tuple[CelRule, ...] = (
    CelRule(
        rule=(
            "!has(self.topology) || self.topology.mode != 'disaggregated'"
            f" || self.engine.kind in {cel_list(_DISAGGREGATING)}"
        ),
        message=(
            f"topology.mode disaggregated needs engine.kind {_DISAGGREGATING[0]}"
            f" (or {either(_DISAGGREGATING[1:])}): Chunkpilot renders prefill/decode"
            " disaggregation for vLLM only (its KV-transfer connectors); set engine.kind: vllm or"
            " topology.mode: colocated"
        ),
        field_path=".topology.mode",
        check=lambda o: not _disaggregated(o) or _disaggregates(o.engine.kind),
    ),
    CelRule(
        rule=(
            "!has(self.topology) || self.topology.mode != 'disaggregated' || !has(self.engine.version)"
            f" || {kind_is_not('self.engine.kind', _DISAGGREGATING)}"
            f" || !self.engine.version.matches('{_BEFORE_KV_CONNECTOR}')"
        ),
        message=(
            f"topology.mode disaggregated needs vLLM {KV_CONNECTOR_SINCE} or later (the first release with"
            " the NixlConnector KV connector): raise engine.version or leave it unset"
        ),
        field_path=".engine.version",
        check=lambda o: (
            not _disaggregated(o)
            or not _disaggregates(o.engine.kind)
            or _BEFORE_KV_CONNECTOR_RE.match(o.engine.version) is None
        ),
    ),
    CelRule(
        rule="!has(self.topology) || self.topology.mode != 'disaggregated' || !self.autotune.liveAdjust",
        message=(
            "autotune.liveAdjust cannot be combined with topology.mode disaggregated (the limits route"
            " adjusts one colocated track): set autotune.liveAdjust: false"
        ),
        field_path=".autotune.liveAdjust",
        check=lambda o: not _disaggregated(o) or not o.autotune.live_adjust,
    ),
    CelRule(
        rule=(
            "!has(self.topology) || self.topology.mode != 'disaggregated'"
            f" || self.engine.extraArgs.all(a, !a.matches('{_KV_TRANSFER_FLAG_PATTERN}'))"
        ),
        message=(
            "engine.extraArgs must not set --kv-transfer-config with topology.mode disaggregated: the"
            " operator renders it from topology.kvTransfer"
        ),
        field_path=".engine.extraArgs",
        check=lambda o: (
            not _disaggregated(o) or not any(_KV_TRANSFER_FLAG_RE.match(a) for a in o.engine.extra_args)
        ),
    ),
    *_pool_rules(),
)


def _reserves_colon(kind: str) -> bool:
    return kind in ENGINES and ENGINES[kind].reserves_colon_in_served_name


def _served_name_rules() -> tuple[CelRule, ...]:
    """``model.servedName`` without ``:`` on the kinds that reserve it (the registry's capability)."""
    reserving = kinds(where="reserves_colon_in_served_name")
    if not reserving:
        return ()
    names = either(ENGINES[kind].display_name for kind in reserving)
    return (
        CelRule(
            rule=(
                f"{kind_is_not('self.engine.kind', reserving)} || !has(self.model.servedName)"
                " || !self.model.servedName.contains(':')"
            ),
            message=(
                f"model.servedName must not contain ':' on {names} (it reserves 'model:adapter' for LoRA):"
                " choose another servedName"
            ),
            field_path=".model.servedName",
            check=lambda o: (
                not _reserves_colon(o.engine.kind)
                or o.model.served_name is None
                or ":" not in o.model.served_name
            ),
        ),
    )


class LabelSelectorSpec(ApiModel):
    """A label selector of exact matches (Kubernetes' ``matchLabels``)."""

    match_labels: dict[Annotated[str, Field(max_length=316)], Annotated[str, Field(max_length=63)]] = Field(
        default_factory=dict,
        max_length=16,
        description="Labels the object must carry; empty selects every object.",
    )


class IPBlockSpec(ApiModel):
    """An address range (Kubernetes' ``ipBlock``)."""

    cidr: str = Field(max_length=64, pattern=r"^[0-9a-fA-F:.]+/[0-9]{1,3}$", description="e.g. 10.0.0.0/8")
    except_: list[Annotated[str, Field(max_length=64, pattern=r"^[0-9a-fA-F:.]+/[0-9]{1,3}$")]] = Field(
        default_factory=list, max_length=16, alias="except", description="Ranges of cidr left out."
    )


class NetworkPeerSpec(ApiModel):
    """Who may reach the engines: pods (of namespaces) or an address range (a NetworkPolicy peer)."""

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            rule="has(self.ipBlock) != (has(self.namespaceSelector) || has(self.podSelector))",
            message=(
                "a network peer is either ipBlock or namespaceSelector/podSelector:"
                " set one kind, as a Kubernetes NetworkPolicy peer does"
            ),
            field_path=".ipBlock",
            check=lambda o: (
                (o.ip_block is not None) != (o.namespace_selector is not None or o.pod_selector is not None)
            ),
        ),
    )

    namespace_selector: LabelSelectorSpec | None = Field(
        default=None, description="Namespaces whose pods may connect (with podSelector: those pods of them)."
    )
    pod_selector: LabelSelectorSpec | None = Field(
        default=None,
        description="Pods that may connect (of this namespace, unless namespaceSelector is set).",
    )
    ip_block: IPBlockSpec | None = Field(default=None, description="Addresses that may connect.")


class NetworkPolicySpec(ApiModel):
    """An optional NetworkPolicy for the service's pods."""

    enabled: bool = Field(
        default=False,
        description=(
            "Render a NetworkPolicy: the service's pods accept connections on the engine port only from"
            " the clients below, the operator's namespace and Prometheus's (the installation's settings),"
            " and on any port from the service's own pods (router to engines, KV transfer between its"
            " pools). Needs a network plugin that enforces NetworkPolicies."
        ),
    )
    clients: list[NetworkPeerSpec] = Field(
        default_factory=list,
        max_length=16,
        description="Who may call the service's engines; empty: every pod of the service's namespace.",
    )


class InferenceServiceSpec(ApiModel):
    """Desired state of an InferenceService."""

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        *_served_name_rules(),
        CelRule(
            rule=(
                "!has(self.model.maxModelLen) || self.engine.enableChunkedPrefill"
                " || self.engine.maxNumBatchedTokens >= self.model.maxModelLen"
            ),
            message=(
                "engine.maxNumBatchedTokens must be >= model.maxModelLen when enableChunkedPrefill is false:"
                " enable chunked prefill or raise the budget"
            ),
            field_path=".engine.maxNumBatchedTokens",
            check=lambda o: (
                o.model.max_model_len is None
                or o.engine.enable_chunked_prefill
                or o.engine.max_num_batched_tokens >= o.model.max_model_len
            ),
        ),
        CelRule(
            rule=(
                "!has(self.model.maxModelLen)"
                " || self.engine.longPrefillTokenThreshold <= self.model.maxModelLen"
            ),
            message="engine.longPrefillTokenThreshold must be <= model.maxModelLen: lower the threshold",
            field_path=".engine.longPrefillTokenThreshold",
            check=lambda o: (
                o.model.max_model_len is None
                or o.engine.long_prefill_token_threshold <= o.model.max_model_len
            ),
        ),
        CelRule(
            rule=(
                "!has(self.resources.gpusPerReplica)"
                " || self.resources.gpusPerReplica == self.engine.tensorParallelSize"
            ),
            message=(
                "resources.gpusPerReplica must equal engine.tensorParallelSize: make them equal or unset it"
            ),
            field_path=".resources.gpusPerReplica",
            check=lambda o: (
                o.resources.gpus_per_replica is None
                or o.resources.gpus_per_replica == o.engine.tensor_parallel_size
            ),
        ),
        CelRule(
            rule="!self.autotune.enabled || has(self.slo)",
            message=(
                "slo is required when autotune.enabled is true: declare the itl and ttft targets to tune for"
            ),
            field_path=".slo",
            check=lambda o: not o.autotune.enabled or o.slo is not None,
        ),
        *_TOPOLOGY_RULES,
        CelRule(
            rule="!has(self.scaling) || self.scaling.mode == 'Off' || self.autotune.enabled",
            message=(
                "autotune.enabled must be true when scaling.mode is Advise or Auto: the planner sizes"
                " replicas with the service's twin, which the tuner fits from the engines' telemetry"
            ),
            field_path=".autotune.enabled",
            check=lambda o: not o.scaling.plans or o.autotune.enabled,
        ),
    )

    model: ModelSpec = Field(description="The model to serve.")
    engine: EngineSpec = Field(default_factory=EngineSpec, description="Engine and scheduler settings.")
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec, description="GPUs and placement.")
    replicas: int = Field(default=1, ge=0, le=1000, description="Stable replicas (canaries come on top).")
    slo: SLOSpec | None = Field(default=None, description="Latency objectives; required for autotuning.")
    autotune: AutotuneSpec = Field(default_factory=AutotuneSpec, description="Online tuning of the knobs.")
    topology: TopologySpec | None = Field(
        default=None,
        description=(
            "Colocated (unset: every replica prefills and decodes) or disaggregated prefill and decode"
            " pools behind a router; a disaggregated service does not use spec.replicas."
        ),
    )
    network_policy: NetworkPolicySpec | None = Field(
        default=None,
        description="Who may reach the service's pods (unset: no policy of its own; the namespace's apply).",
    )
    scaling: ScalingSpec = Field(
        default_factory=ScalingSpec,
        description="Who decides the stable replicas: spec.replicas (Off), or the planner on the twin.",
    )

    @property
    def disaggregated(self) -> bool:
        """Whether the service runs separate prefill and decode pools."""
        return _disaggregated(self)

    @property
    def kv_transfer(self) -> KVTransferSpec:
        """``topology.kvTransfer`` with its defaults when unset."""
        return (self.topology.kv_transfer if self.topology else None) or KVTransferSpec()

    @property
    def router(self) -> RouterSpec:
        """``topology.router`` with its defaults when unset."""
        return (self.topology.router if self.topology else None) or RouterSpec()

    def pool(self, role: PoolRole | str) -> PoolSpec:
        """The pool of ``role``; ValueError for a colocated service."""
        pool = self.topology.pool(role) if self.topology is not None and self.disaggregated else None
        if pool is None:
            raise ValueError(
                f"the service has no {PoolRole(role).value} pool: topology.mode is not disaggregated"
            )
        return pool

    def pool_config(self, role: PoolRole | str) -> EngineConfig:
        """The knobs the pool of ``role`` runs: its own, the rest from ``spec.engine``."""
        base = EngineConfig.from_engine(self.engine).model_dump()
        return EngineConfig.model_validate({**base, **self.pool(role).knobs()})


# --------------------------------------------------------------------------- engine config (tunable knobs)


class EngineConfig(ApiModel):
    """The tunable knob set: the part of :class:`EngineSpec` a trial changes.

    A config is complete: :meth:`apply_to` overwrites every tuned knob, so an unset
    optional knob means "unset in the engine".  Build one from a spec with
    :meth:`from_engine` and change knobs with ``model_copy(update=...)``.
    """

    cel_rules: ClassVar[tuple[CelRule, ...]] = _KNOB_RULES

    #: The tuned knobs of the knob table (:mod:`chunkpilot.api.knobs`), as attribute names, in its order.
    KNOBS: ClassVar[tuple[str, ...]] = TUNABLE_NAMES

    max_num_batched_tokens: int = Field(ge=1, le=1_048_576, description=doc("max_num_batched_tokens"))
    max_num_seqs: int = Field(ge=1, le=65_536, description=doc("max_num_seqs"))
    max_num_active_seqs: int | None = Field(
        default=None, ge=1, le=65_536, description=doc("max_num_active_seqs")
    )
    long_prefill_token_threshold: int = Field(
        default=_default("long_prefill_token_threshold"),
        ge=0,
        le=4_194_304,
        description=doc("long_prefill_token_threshold"),
    )
    max_num_partial_prefills: int | None = Field(
        default=None, ge=1, le=1024, description=doc("max_num_partial_prefills")
    )
    max_long_partial_prefills: int | None = Field(
        default=None, ge=1, le=1024, description=doc("max_long_partial_prefills")
    )

    @classmethod
    def from_engine(cls, engine: EngineSpec) -> EngineConfig:
        """The knobs currently set in ``engine``."""
        return cls.model_validate({knob: getattr(engine, knob) for knob in cls.KNOBS})

    def config_hash(self) -> str:
        """Short stable hex digest of the knobs (8 characters), used in labels and names.

        Unset knobs are left out, so adding a new optional knob keeps existing hashes.
        """
        canonical = json.dumps(self.to_k8s(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:8]

    def apply_to(self, engine: EngineSpec) -> EngineSpec:
        """A copy of ``engine`` with these knobs; validated, so an inconsistent result raises."""
        data: dict[str, Any] = engine.model_dump()
        data.update({knob: getattr(self, knob) for knob in self.KNOBS})
        return EngineSpec.model_validate(data)

    def summary(self) -> str:
        """Compact human-readable form for printer columns, e.g. ``budget=3072 seqs=256``."""
        return knob_summary({knob: getattr(self, knob) for knob in self.KNOBS})


# --------------------------------------------------------------------------- status


class ServiceSummary(StatusModel):
    """Preformatted strings for the printer columns."""

    itl: str | None = Field(default=None, max_length=64, description="Measured/target ITL, e.g. 43/50ms.")
    ttft: str | None = Field(
        default=None, max_length=64, description="Measured/target TTFT, e.g. 812/2000ms."
    )
    slo: SLOState | None = Field(default=None, description="Met, Violated or Unknown.")


class TwinState(StrEnum):
    """Whether the service's digital twin is in use."""

    FITTED = "Fitted"  # fitted to the engine's step telemetry; the tuner searches on it
    WAITING = "Waiting"  # telemetry present but too little to fit yet
    UNAVAILABLE = "Unavailable"  # no step telemetry: the tuner tunes on measurements alone


class TwinCandidate(StatusModel):
    """One configuration the twin ranked, with its predicted capacity at SLO."""

    config: EngineConfig = Field(description="The knobs.")
    capacity_req_s: float = Field(ge=0, description="Predicted capacity at SLO, requests/s per replica.")
    capacity: float = Field(ge=0, description="Predicted capacity in the objective's unit, per GPU.")
    robust_capacity: float | None = Field(
        default=None,
        ge=0,
        description="Predicted capacity in the objective's unit, per GPU, under the twin's step-time "
        "uncertainty at its budget (the mean over the fit, one standard error slower and one faster, at "
        "most the capacity); candidates are ordered by it, the capacity standing in where it was not "
        "evaluated.",
    )


class ServiceTwin(StatusModel):
    """The service's digital twin: its fit, its error at the live load and what it predicts.

    ``error`` compares the twin's ITL and TTFT quantiles with the stable track's at the live load;
    ``stepFitError`` is the RMS relative error of the fitted step-time model on the step telemetry.
    """

    state: TwinState = Field(description="Fitted, Waiting or Unavailable.")
    message: str = Field(default="", max_length=1024, description="Why, in words.")
    fitted_at: datetime | None = Field(default=None, description="When the twin was last fitted.")
    config_hash: str | None = Field(
        default=None, max_length=16, description="config_hash of the stable config at the last fit."
    )
    refit_trial: int | None = Field(
        default=None, ge=0, description="Latest trial whose canary steps the fit includes."
    )
    steps: float | None = Field(default=None, ge=0, description="Engine steps the fit rests on.")
    step_fit_error: float | None = Field(
        default=None, ge=0, description="RMS relative error of the fitted step times."
    )
    scales: dict[str, float] | None = Field(
        default=None,
        max_length=8,
        description="Fitted engine relative to its datasheet (compute, memory, stepOverhead, "
        "sequenceOverhead of the linear layers and fixed costs; attentionCompute, attentionMemory, "
        "elementwise relative to the linear layers; 1.0 = the datasheet).",
    )
    error: float | None = Field(
        default=None,
        description="The twin's error on the stable track at the last ranking (relative, beyond the "
        "measurement's sampling band, the larger of ITL and TTFT).",
    )
    tolerance: float | None = Field(default=None, ge=0, description="Largest error the tuner acts on.")
    itl_offset_ms: float | None = Field(
        default=None,
        ge=0,
        description="ITL the engine adds outside its steps (token delivery), measured minus predicted on "
        "the stable track; added to every prediction and taken off the ITL target the twin ranks for.",
    )
    ttft_offset_ms: float | None = Field(
        default=None, ge=0, description="The same offset for the first token, added to TTFT."
    )
    predicted_itl_ms: float | None = Field(default=None, ge=0, description="Predicted stable ITL quantile.")
    predicted_ttft_ms: float | None = Field(default=None, ge=0, description="Predicted stable TTFT quantile.")
    measured_itl_ms: float | None = Field(default=None, ge=0, description="Measured stable ITL quantile.")
    measured_ttft_ms: float | None = Field(default=None, ge=0, description="Measured stable TTFT quantile.")
    capacity_req_s: float | None = Field(
        default=None, ge=0, description="Predicted capacity at SLO of the stable config, req/s per replica."
    )
    capacity: float | None = Field(
        default=None, ge=0, description="The same in the objective's unit, per GPU."
    )
    capacity_unit: str | None = Field(default=None, max_length=32, description="req/s/GPU or tok/s/GPU.")
    live_request_rate: float | None = Field(
        default=None, ge=0, description="Live requests/s per stable replica."
    )
    candidates: list[TwinCandidate] = Field(
        default_factory=list, max_length=16, description="The twin's best configurations, best first."
    )
    evaluations: int | None = Field(default=None, ge=0, description="Capacity searches of the last ranking.")
    cpu_seconds: float | None = Field(default=None, ge=0, description="CPU seconds of the last ranking.")


class TopologyRecommendation(StatusModel):
    """The twin's answer, once colocated tuning is SLOInfeasible: would prefill/decode disaggregation help?"""

    key: str | None = Field(default=None, max_length=64, description="The twin fit it was computed on.")
    computed_at: datetime | None = Field(default=None, description="When it was computed.")
    message: str = Field(default="", max_length=2048, description="The recommendation, in words.")
    meets_slo: bool | None = Field(default=None, description="A disaggregated topology meets both SLOs.")
    prefill_replicas: int | None = Field(default=None, ge=0, description="Best topology: prefill replicas.")
    decode_replicas: int | None = Field(default=None, ge=0, description="Best topology: decode replicas.")
    prefill_max_num_batched_tokens: int | None = Field(default=None, ge=0, description="Prefill pool budget.")
    decode_max_num_seqs: int | None = Field(default=None, ge=0, description="Decode pool maxNumSeqs.")
    capacity_req_s: float | None = Field(default=None, ge=0, description="Its predicted capacity, req/s.")
    colocated_capacity_req_s: float | None = Field(
        default=None, ge=0, description="The best colocated predicted capacity on the same replicas, req/s."
    )


class PoolStatus(StatusModel):
    """One engine pool of a disaggregated service, as its Deployment reports it."""

    desired_replicas: int | None = Field(default=None, ge=0, description="Replicas the pool should run.")
    replicas: int | None = Field(default=None, ge=0, description="Engine pods of the pool.")
    ready_replicas: int | None = Field(default=None, ge=0, description="Engine pods ready to serve.")
    config: EngineConfig | None = Field(default=None, description="Knobs the pool's pods run with.")
    config_hash: str | None = Field(
        default=None,
        max_length=16,
        description="config_hash of config (pod label chunkpilot.io/config-hash).",
    )


class RouterStatus(StatusModel):
    """The router Deployment in front of the pools."""

    desired_replicas: int | None = Field(default=None, ge=0, description="Router replicas it should run.")
    replicas: int | None = Field(default=None, ge=0, description="Router pods.")
    ready_replicas: int | None = Field(default=None, ge=0, description="Router pods ready to serve.")


class TopologyStatus(StatusModel):
    """The service's topology as rendered: the mode, and for disaggregated each pool and the router."""

    mode: TopologyMode = Field(description="colocated or disaggregated.")
    prefill: PoolStatus | None = Field(default=None, description="The prefill pool.")
    decode: PoolStatus | None = Field(default=None, description="The decode pool.")
    router: RouterStatus | None = Field(default=None, description="The router.")


class InferenceServiceStatus(StatusModel):
    """Observed state of an InferenceService, written by the operator and the tuner."""

    phase: ServicePhase | None = Field(
        default=None, description="Pending, Deploying, Ready, Tuning, Degraded or Failed."
    )
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation the status was computed for."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=32,
        description="Ready, Progressing, SLOMet, Tuning, Degraded, MetricsUnavailable, SLOInfeasible, "
        "TwinUnavailable, TopologyChange.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    applied_config: EngineConfig | None = Field(default=None, description="Knobs the stable pods run with.")
    applied_config_hash: str | None = Field(
        default=None,
        max_length=16,
        description="config_hash of appliedConfig (pod label chunkpilot.io/config-hash).",
    )
    best_config: EngineConfig | None = Field(default=None, description="Best feasible knobs found so far.")
    best_trial: str | None = Field(
        default=None, max_length=253, description="TuningTrial that found bestConfig."
    )
    current_trial: str | None = Field(default=None, max_length=253, description="TuningTrial now running.")
    trials_completed: int | None = Field(default=None, ge=0, description="Finished trials.")
    replicas: int | None = Field(default=None, ge=0, description="Engine pods (stable and canary).")
    ready_replicas: int | None = Field(default=None, ge=0, description="Engine pods ready to serve.")
    last_measurement: Measurement | None = Field(default=None, description="Latest SLO measurement (stable).")
    summary: ServiceSummary | None = Field(default=None, description="Strings shown by kubectl get.")
    twin: ServiceTwin | None = Field(default=None, description="The service's digital twin (tuner).")
    topology: TopologyStatus | None = Field(
        default=None, description="Disaggregated services: each pool's replicas and knobs, and the router."
    )
    recommendation: TopologyRecommendation | None = Field(
        default=None, description="Prefill/decode disaggregation on the twin, when the SLOs are infeasible."
    )
    best_topology: TopologySpec | None = Field(
        default=None,
        description=(
            "A prefill/decode topology a topology trial promoted (autotune.allowTopologyChange; the tuner"
            " writes it). The operator runs it while autotune.enabled and allowTopologyChange are true"
            " and spec.topology declares no disaggregated topology (a declared one wins)."
        ),
    )
    best_topology_trial: str | None = Field(
        default=None,
        max_length=253,
        description=(
            "TuningTrial that last changed the topology: the one that promoted bestTopology, or (with"
            " bestTopology unset) the colocated topology trial that brought the service back to colocated."
        ),
    )
    stable_replicas: int | None = Field(
        default=None, ge=0, description="Stable engine pods (the scale subresource's replicas)."
    )
    selector: str | None = Field(
        default=None,
        max_length=512,
        description="Label selector of the stable engine pods (the scale subresource's, for an HPA).",
    )
    scaling: ScalingStatus | None = Field(
        default=None, description="The planner's decision (scaling.mode Advise or Auto; tuner)."
    )


#: Longest service name: leaves room for the suffixes of the objects the operator creates.
MAX_SERVICE_NAME_LENGTH = 52
_DNS1035 = "^[a-z]([-a-z0-9]*[a-z0-9])?$"


class InferenceService(Resource):
    """An LLM inference service with chunked prefill, latency SLOs and optional autotuning."""

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            rule=(
                f"self.metadata.name.size() <= {MAX_SERVICE_NAME_LENGTH}"
                f" && self.metadata.name.matches('{_DNS1035}')"
            ),
            message=(
                f"metadata.name must be a DNS-1035 label of at most {MAX_SERVICE_NAME_LENGTH} characters"
                " (lower-case letters, digits and '-', starting with a letter): it names the Service and"
                " Deployments"
            ),
            check=lambda o: (
                o.metadata.name is None
                or (
                    len(o.metadata.name) <= MAX_SERVICE_NAME_LENGTH
                    and re.match(_DNS1035, o.metadata.name) is not None
                )
            ),
        ),
    )

    api_version: Literal["chunkpilot.io/v1alpha1"] = Field(
        default="chunkpilot.io/v1alpha1", alias="apiVersion"
    )
    kind: Literal["InferenceService"] = "InferenceService"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: InferenceServiceSpec
    status: InferenceServiceStatus | None = None

    def running_replicas(self) -> int:
        """The stable replicas the service runs: in ``scaling.mode: Auto`` the planner's decision
        (within ``minReplicas`` and ``maxReplicas``) once it has one, else ``spec.replicas``."""
        scaling = self.spec.scaling
        decided = self.status.scaling if self.status is not None else None
        if (
            not scaling.acts
            or decided is None
            or decided.desired_replicas is None
            or self.spec.disaggregated
            or not decided.decided_for(disaggregated=False)
        ):
            return self.spec.replicas
        return max(
            scaling.min_replicas,
            min(scaling.max_replicas or decided.desired_replicas, decided.desired_replicas),
        )

    def running_pool_replicas(self, role: PoolRole | str) -> int:
        """The replicas a disaggregated service's pool of ``role`` runs: in ``scaling.mode: Auto``
        the planner's decision for it (within ``minReplicas`` and ``maxReplicas``) once it has one,
        else ``topology.<role>.replicas``."""
        declared = self.spec.pool(role).replicas
        scaling = self.spec.scaling
        decided = self.status.scaling if self.status is not None else None
        found = (
            decided.pool(PoolRole(role).value)
            if decided is not None and decided.decided_for(disaggregated=True)
            else None
        )
        if not scaling.acts or found is None or found.desired_replicas is None:
            return declared
        most = scaling.max_replicas or found.desired_replicas
        return max(scaling.min_replicas, min(most, found.desired_replicas))

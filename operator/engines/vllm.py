"""Render ``vllm serve`` arguments for the vLLM version in the spec.

Flags come and go between vLLM releases. Each version-dependent knob of the
knob table (:mod:`chunkpilot.api.knobs`) becomes one :class:`KnobRule`; a knob
set in the spec that the deployed version cannot honour is refused
(:class:`UnsupportedKnob`) instead of producing a pod that crashes on an
unknown flag or silently ignores it.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from chunkpilot.engine.vllm_plugin.render import (
    DEFAULT_CONTROL_FILE,
    ENGINE_IMAGE_REPOSITORY,
    SUPPORTED_VLLM_VERSIONS,
    PluginSettings,
    engine_image,
    plugin_args,
    plugin_env,
)
from chunkpilot.engine.vllm_plugin.telemetry import MULTIPROC_ENV
from chunkpilot.operator.engines import common
from chunkpilot.operator.engines.flags import Vocabulary
from chunkpilot.operator.engines.knobcheck import foreign_knob
from chunkpilot.operator.engines.versions import EngineVersion

from chunkpilot.api import EngineKind, InferenceServiceSpec
from chunkpilot.api.engines import VLLM_ENGINE, image_path
from chunkpilot.api.knobs import KNOBS, VLLM, VLLM_0_33, VLLM_V0_REMOVED, KnobSpec

#: Oldest release whose command line this renderer knows.
MIN_VERSION: Final = EngineVersion(0, 8, 0)
#: Partial-prefill limits are honoured natively (by the V0 scheduler) only before this release.
V0_REMOVED: Final = VLLM_V0_REMOVED
#: ``--no-enable-chunked-prefill`` exists from here on; earlier releases took ``=false``.
#: (``--no-enable-prefix-caching`` exists in every supported release.)
CHUNKED_PREFILL_NEGATION_SINCE: Final = EngineVersion(0, 10, 0)
#: Newest knobs: the first release this renderer knows to accept them.
V0_33: Final = VLLM_0_33
#: The vLLM flag dialect (the simulator speaks it too): every managed flag is spelt by it.
FLAGS: Final = Vocabulary(VLLM)

#: prometheus_client's multiprocess folder in the Chunkpilot engine image (an emptyDir per pod).
METRICS_DIR: Final = "/run/chunkpilot-metrics"


def upstream_vllm_image(version: str) -> str:
    """The upstream OpenAI-compatible server image for ``version`` (tags carry a ``v``)."""
    return f"{VLLM_ENGINE.image_repository}:v{version.removeprefix('v')}"


def chunkpilot_engine_release(version: str) -> str | None:
    """The release whose Chunkpilot engine image serves ``version``, or None when none is built.

    Only plain release numbers match (``0.33.0``, ``v0.33``); a suffixed build such
    as ``0.33.0.post1`` is not the release the image was built from.
    """
    bare = version.strip().removeprefix("v")
    try:
        parsed = str(EngineVersion.parse(bare))
    except ValueError:
        return None
    if parsed not in SUPPORTED_VLLM_VERSIONS or not parsed.startswith(bare):
        return None
    return parsed


def default_vllm_image(version: str) -> str:
    """The image used when ``spec.engine.image`` is empty.

    The Chunkpilot engine image (upstream vLLM plus the scheduler plugin, built
    from ``engine_image/Dockerfile``) for the releases it is built for
    (``SUPPORTED_VLLM_VERSIONS``), the upstream ``vllm/vllm-openai`` image otherwise.
    """
    release = chunkpilot_engine_release(version)
    return engine_image(release) if release is not None else upstream_vllm_image(version)


@dataclass(frozen=True)
class KnobRule:
    """A spec knob whose flag only exists in a range of versions ``[since, until)``."""

    knob: str
    flag: str
    is_set: Callable[[InferenceServiceSpec], bool]
    since: EngineVersion | None = None
    until: EngineVersion | None = None
    #: From ``until`` on, the Chunkpilot engine image's scheduler plugin enforces the knob instead.
    plugin: bool = False

    @classmethod
    def of(cls, row: KnobSpec) -> KnobRule:
        """The rule of a knob-table row, from its vLLM flag's version columns."""
        flag = row.flag(VLLM)
        return cls(
            knob=row.path,
            flag=flag.flag,
            is_set=lambda spec: row.is_set(getattr(spec.engine, row.name)),
            since=flag.since,
            until=flag.until,
            plugin=flag.plugin,
        )

    def supports(self, version: EngineVersion) -> bool:
        return (self.since is None or version >= self.since) and (self.until is None or version < self.until)

    def problem(self, version: EngineVersion) -> common.UnsupportedKnob:
        if self.until is not None and version >= self.until:
            detail = f"the flag was removed in {self.until} (the V1 engine does not enforce it)"
            remedy = f"unset {self.knob.rsplit('.', 1)[-1]} or pin spec.engine.version below {self.until}"
            if self.plugin:
                remedy += ", or " + _plugin_remedy(version)
        else:
            detail = f"the flag is only rendered for {VLLM_ENGINE.display_name} {self.since} and later"
            remedy = (
                f"unset {self.knob.rsplit('.', 1)[-1]} or raise spec.engine.version to {self.since} or later"
            )
        return common.UnsupportedKnob(
            knob=self.knob,
            flag=self.flag,
            engine=VLLM_ENGINE.display_name,
            version=str(version),
            detail=detail,
            remedy=remedy,
        )


def _plugin_remedy(version: EngineVersion) -> str:
    """How to get the Chunkpilot engine image, whose scheduler plugin enforces the knob."""
    release = str(version)
    if release in SUPPORTED_VLLM_VERSIONS:
        return (
            f"run the Chunkpilot engine image, the default for {VLLM_ENGINE.display_name} {release}: clear"
            f" spec.engine.image or set it to {engine_image(release)} (for an image of your own with the"
            " plugin installed, set spec.engine.pluginInstalled: true)"
        )
    newest = SUPPORTED_VLLM_VERSIONS[-1]
    return (
        f"set spec.engine.version to {newest} and leave spec.engine.image empty to run the Chunkpilot"
        f" engine image ({engine_image(newest)})"
    )


#: One rule per knob whose vLLM flag is versioned, in knob-table order.
KNOB_RULES: Final[tuple[KnobRule, ...]] = tuple(
    KnobRule.of(row) for row in KNOBS if VLLM in row.flags and row.flag(VLLM).versioned
)


def check_version(version_text: str) -> EngineVersion | common.UnsupportedEngineVersion:
    """Parse the spec's version and make sure this renderer knows its command line."""
    return common.check_engine_version(VLLM_ENGINE.display_name, MIN_VERSION, version_text)


def first_unsupported_knob(
    spec: InferenceServiceSpec, version: EngineVersion
) -> common.UnsupportedKnob | None:
    """The first knob set in ``spec`` that ``version`` cannot honour, if any."""
    for rule in KNOB_RULES:
        if rule.is_set(spec) and not rule.supports(version):
            if rule.plugin and plugin_enforces(spec, version):
                continue
            return rule.problem(version)
    for row in KNOBS:
        # Knobs of other engines (SGLang's, TensorRT-LLM's) are refused, never silently dropped.
        if VLLM not in row.flags and row.is_set(getattr(spec.engine, row.name)):
            return foreign_knob(row, VLLM, version)
    return None


def has_plugin(spec: InferenceServiceSpec) -> bool:
    """Whether the engine's image has Chunkpilot's plugin: as ``spec.engine.pluginInstalled`` says,
    else when it is Chunkpilot's engine image (explicitly or by default, from any registry)."""
    if spec.engine.plugin_installed is not None:
        return spec.engine.plugin_installed
    image = spec.engine.image or default_vllm_image(spec.engine.version)
    return image_path(image) == image_path(ENGINE_IMAGE_REPOSITORY)


def uses_plugin(spec: InferenceServiceSpec, version: EngineVersion) -> bool:
    """True when a V1 release of vLLM runs an image with Chunkpilot's plugin (:func:`has_plugin`)."""
    return spec.engine.kind == EngineKind.VLLM and version >= V0_REMOVED and has_plugin(spec)


def plugin_enforces(spec: InferenceServiceSpec, version: EngineVersion) -> bool:
    """Whether the partial-prefill limits are honoured on a V1 release.

    vLLM: when the engine runs the Chunkpilot engine image. The simulator mirrors
    vLLM with its default image for that release (it enforces the limits itself,
    from the same flags it accepts for V0 releases).
    """
    if spec.engine.kind == EngineKind.SIM:
        return version >= V0_REMOVED and chunkpilot_engine_release(spec.engine.version) is not None
    return uses_plugin(spec, version)


def live_adjust_enabled(spec: InferenceServiceSpec, version: EngineVersion) -> bool:
    """``spec.autotune.liveAdjust`` on an engine that can do it: vLLM with the Chunkpilot image.

    On the upstream image the field renders nothing: the API defines it as an opt-in
    "where the engine allows it" (the simulator renders its own, see ``engines.sim``).
    """
    return spec.autotune.live_adjust and uses_plugin(spec, version)


def plugin_settings(spec: InferenceServiceSpec, version: EngineVersion) -> PluginSettings:
    """What the scheduler plugin is asked for (nothing unless the engine image is used)."""
    if not uses_plugin(spec, version):
        return PluginSettings()
    engine = spec.engine
    return PluginSettings(
        max_num_partial_prefills=engine.max_num_partial_prefills,
        max_long_partial_prefills=engine.max_long_partial_prefills,
        live_adjust=live_adjust_enabled(spec, version),
        control_file=DEFAULT_CONTROL_FILE,
    )


def honours_partial_prefills(spec: InferenceServiceSpec) -> bool:
    """Whether the engine in ``spec`` enforces maxNumPartialPrefills / maxLongPartialPrefills.

    Natively before 0.9.0 (the V0 scheduler); from then on only through the
    Chunkpilot scheduler plugin (see :func:`plugin_enforces`).
    """
    version = check_version(spec.engine.version)
    if isinstance(version, common.UnsupportedEngineVersion):
        return False
    return version < V0_REMOVED or plugin_enforces(spec, version)


def _speculative_config(spec: InferenceServiceSpec) -> dict[str, Any] | None:
    """The ``--speculative-config`` object (the vocabulary writes it as compact JSON, keys sorted)."""
    speculative = spec.engine.speculative
    if speculative is None:
        return None
    config: dict[str, Any] = {
        "method": str(speculative.method),
        "num_speculative_tokens": speculative.num_speculative_tokens,
    }
    if speculative.draft_model:
        config["model"] = speculative.draft_model
    return config


def vllm_args(spec: InferenceServiceSpec, version: EngineVersion) -> list[str]:
    """The ``vllm serve`` argument vector (model first) for ``version``; knobs already checked.

    Every flag is the knob table's (:data:`FLAGS`); the order is the table's too.
    """
    engine = spec.engine
    model, _ = common.model_argument(spec.model.name)
    args = [
        model,
        *common.listen_args(FLAGS),
        *FLAGS.server_option("served-model-name", common.served_model_name(spec)),
        *common.model_limit_args(FLAGS, spec, "max-model-len"),
    ]
    args += FLAGS.option("max_num_batched_tokens", engine.max_num_batched_tokens)
    args += FLAGS.option("max_num_seqs", engine.max_num_seqs)
    args += FLAGS.option("max_num_active_seqs", engine.max_num_active_seqs)
    args += FLAGS.switch(
        "enable_chunked_prefill",
        engine.enable_chunked_prefill,
        negation=version >= CHUNKED_PREFILL_NEGATION_SINCE,
    )
    args += FLAGS.option("long_prefill_token_threshold", engine.long_prefill_token_threshold)
    args += FLAGS.present(
        "long_prefill_token_threshold_adaptive", engine.long_prefill_token_threshold_adaptive
    )
    extra_args = list(engine.extra_args)
    if uses_plugin(spec, version):
        plugin = plugin_args(plugin_settings(spec, version), extra_args)
        if plugin:
            # plugin_args merged any --additional-config of extra_args into its own.
            extra_args = _without_additional_config(extra_args)
            args += plugin
    else:
        args += FLAGS.option("max_num_partial_prefills", engine.max_num_partial_prefills)
        args += FLAGS.option("max_long_partial_prefills", engine.max_long_partial_prefills)
    args += FLAGS.switch("enable_prefix_caching", engine.enable_prefix_caching)
    args += FLAGS.option("speculative", _speculative_config(spec))
    args += FLAGS.option("gpu_memory_utilization", engine.gpu_memory_utilization)
    args += FLAGS.option("tensor_parallel_size", engine.tensor_parallel_size)
    if version >= V0_33:
        args += ["--shutdown-timeout", str(common.SHUTDOWN_TIMEOUT_S)]
    args += extra_args
    return args


def _without_additional_config(args: list[str]) -> list[str]:
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg == "--additional-config":
            skip = True
        elif not arg.startswith("--additional-config="):
            out.append(arg)
    return out


def engine_env(spec: InferenceServiceSpec, version: EngineVersion) -> list[dict[str, Any]]:
    """Environment of a vLLM-compatible container: the model token, the engine selection."""
    env = common.model_token_env(spec)
    partial = (
        spec.engine.max_num_partial_prefills is not None or spec.engine.max_long_partial_prefills is not None
    )
    if partial and version < V0_REMOVED:
        # Only the V0 scheduler enforces the partial-prefill limits: select it explicitly.
        env.append({"name": "VLLM_USE_V1", "value": "0"})
    # Live adjustment: allowlist the endpoint plugin (the token is added by the Deployment builder).
    env += plugin_env(plugin_settings(spec, version))
    if uses_plugin(spec, version):
        # The plugin's step telemetry reaches /metrics through prometheus_client's multiprocess folder.
        env.append({"name": MULTIPROC_ENV, "value": METRICS_DIR})
    return env


def render_vllm(spec: InferenceServiceSpec) -> common.RenderResult:
    """Container recipe for a vLLM engine, or the problem that prevents one."""
    version = common.vetted_version(
        check_version(spec.engine.version), lambda checked: first_unsupported_knob(spec, checked)
    )
    if not isinstance(version, EngineVersion):
        return version
    live_adjust = live_adjust_enabled(spec, version)
    return common.gpu_engine_render(
        spec,
        VLLM_ENGINE,
        version=version,
        default_image=default_vllm_image,
        command=["vllm", "serve"],
        args=vllm_args(spec, version),
        env=engine_env(spec, version),
        shm_size=f"{max(2, 4 * spec.engine.tensor_parallel_size)}Gi",
        shutdown_timeout_s=common.SHUTDOWN_TIMEOUT_S,
        live_adjust=live_adjust,
        control_dir=posixpath.dirname(DEFAULT_CONTROL_FILE) if live_adjust else None,
        metrics_dir=METRICS_DIR if uses_plugin(spec, version) else None,
    )


#: vLLM's support: the twin's scheduler is vLLM's own (the default).
SUPPORT: Final = common.EngineSupport(render=render_vllm, default_image=default_vllm_image)

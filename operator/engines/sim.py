"""Render the simulator's command line: the vLLM argument vector plus its own flags.

The simulator accepts the same flags as the vLLM version in the spec, so the
same example runs on either engine; the version checks are shared too, so a
manifest that works on the simulator also works on a GPU. With
``autotune.liveAdjust`` it gets the live-adjustment token like the vLLM plugin.

An SGLang or TensorRT-LLM service whose image is the simulator's (:func:`simulated`) keeps that
engine's rendered arguments and runs them with ``chunkpilot sim serve --engine KIND``: the
simulator speaks that engine's flags, scheduling semantics and metric names.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Final

from chunkpilot.operator.engines.common import (
    EngineRender,
    EngineSupport,
    RenderResult,
    model_argument,
    vetted_version,
)
from chunkpilot.operator.engines.versions import EngineVersion
from chunkpilot.operator.engines.vllm import (
    check_version,
    engine_env,
    first_unsupported_knob,
    vllm_args,
)

from chunkpilot import __version__
from chunkpilot.api import InferenceServiceSpec
from chunkpilot.api.engines import SIM_ENGINE, TRTLLM_ENGINE, image_path, kinds

SIM_RESOURCES: Final = {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}}


def default_sim_image() -> str:
    """The Chunkpilot image (it ships the simulator) matching this operator's version."""
    return f"{SIM_ENGINE.image_repository}:{__version__}"


#: Engine kinds the simulator image runs in their own dialect (the registry's ``simulated``).
SIMULATED_KINDS: Final = kinds(where="simulated")


def is_sim_image(image: str) -> bool:
    """True for the Chunkpilot image (any tag, any registry), which ships the simulator."""
    return image_path(image) == image_path(SIM_ENGINE.image_repository)


def simulated(spec: InferenceServiceSpec, render: RenderResult) -> RenderResult:
    """``render`` of an SGLang or TensorRT-LLM service on the simulator image: the same arguments,
    run by ``chunkpilot sim serve --engine KIND`` on CPU; any other render unchanged."""
    kind = str(spec.engine.kind)
    if kind not in SIMULATED_KINDS or not isinstance(render, EngineRender) or not is_sim_image(render.image):
        return render
    serve = f"chunkpilot sim serve --engine {kind}"
    if (
        kind == TRTLLM_ENGINE.kind
    ):  # the same launch script (it writes the options file), exec'ing the simulator
        command = [
            *render.command[:2],
            render.command[2].replace("exec trtllm-serve", f"exec {serve}"),
            "sim",
        ]
    else:
        command = serve.split()
    return replace(
        render,
        engine=f"{SIM_ENGINE.display_name} ({render.engine})",
        command=command,
        args=[*render.args, "--gpu", str(spec.resources.accelerator)],
        gpus=0,
        resources={k: dict(v) for k, v in SIM_RESOURCES.items()},
        shm_size="64Mi",
        probes=SIM_ENGINE.probes,
    )


def sim_args(spec: InferenceServiceSpec, vllm_argv: list[str]) -> list[str]:
    """The vLLM argument vector followed by the simulator's own flags."""
    extra = list(spec.engine.extra_args)
    base = vllm_argv[: len(vllm_argv) - len(extra)] if extra else list(vllm_argv)
    return [*base, "--gpu", str(spec.resources.accelerator), *extra]


def render_sim(spec: InferenceServiceSpec) -> RenderResult:
    """Container recipe for the CPU simulator, or the problem that prevents one."""
    # The simulator honours exactly what that vLLM version would.
    version = vetted_version(
        check_version(spec.engine.version), lambda checked: first_unsupported_knob(spec, checked)
    )
    if not isinstance(version, EngineVersion):
        return version
    _, volume = model_argument(spec.model.name)
    return EngineRender(
        engine=SIM_ENGINE.display_name,
        version=str(version),
        image=spec.engine.image or default_sim_image(),
        command=["chunkpilot", "sim", "serve"],
        args=sim_args(spec, vllm_args(spec, version)),
        env=engine_env(spec, version),
        gpus=0,
        resources={kind: dict(values) for kind, values in SIM_RESOURCES.items()},
        shm_size="64Mi",
        probes=SIM_ENGINE.probes,
        model_volume=volume,
        # The simulator serves the plugin's live-adjustment route in-process (no control file):
        # the Deployment builder only adds the bearer token from the service's Secret.
        live_adjust=spec.autotune.live_adjust,
    )


#: The simulator's support: it schedules as the vLLM version it mimics.
SUPPORT: Final = EngineSupport(render=render_sim, default_image=lambda _version: default_sim_image())

"""Static checks of ``engine_image/Dockerfile.sim``: it runs ``chunkpilot sim serve MODEL --flags``."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from chunkpilot.engine.sim.flags import sim_config_from_args

from chunkpilot.cli import build_parser

REPO = Path(__file__).resolve().parents[3]
DOCKERFILE = REPO / "engine_image" / "Dockerfile.sim"


def _instructions() -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` pairs with continuation lines joined and comments dropped."""
    lines: list[str] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    assert not pending, "dangling line continuation"
    result = []
    for line in lines:
        keyword, _, rest = line.partition(" ")
        result.append((keyword.upper(), rest.strip()))
    return result


def _exec_form(instruction: str) -> list[str]:
    values = [json.loads(rest) for keyword, rest in _instructions() if keyword == instruction]
    assert len(values) == 1, f"exactly one {instruction} expected"
    value = values[0]
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), (
        f"{instruction} must be exec form"
    )
    return value


def test_entrypoint_is_the_sim_serve_command_the_operator_renders() -> None:
    from chunkpilot.operator.engines.sim import render_sim

    from chunkpilot.api import InferenceService

    entrypoint = _exec_form("ENTRYPOINT")
    assert entrypoint == ["chunkpilot", "sim", "serve"]
    manifest = {
        "apiVersion": "chunkpilot.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "chat", "namespace": "default"},
        "spec": {"model": {"name": "hf://meta-llama/Llama-3.1-8B-Instruct"}, "engine": {"kind": "sim"}},
    }
    render = render_sim(InferenceService.from_manifest(manifest).spec)
    assert getattr(render, "command", None) == entrypoint


def test_console_script_exists_and_default_cmd_parses_as_serve_flags() -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["chunkpilot"] == "chunkpilot.cli:main"
    entrypoint, cmd = _exec_form("ENTRYPOINT"), _exec_form("CMD")
    args = build_parser().parse_args([*entrypoint[1:], *cmd])  # argv[0] is the program itself
    assert args.func.__name__ == "_serve"
    config = sim_config_from_args(args.model, args)
    assert config.model == cmd[0] and args.port == 8000


@pytest.mark.parametrize("keyword", ["FROM", "USER", "EXPOSE"])
def test_image_basics(keyword: str) -> None:
    assert any(k == keyword for k, _ in _instructions())


def test_copied_sources_exist() -> None:
    for keyword, rest in _instructions():
        if keyword == "COPY":
            *sources, _ = rest.split()
            if sources[0].startswith("--from="):
                continue  # from a build stage of the same file, not from the repository
            for source in sources:
                assert (REPO / source).exists(), f"COPY {source}: not in the repository"
    exposed = [rest for keyword, rest in _instructions() if keyword == "EXPOSE"]
    assert exposed == ["8000"]


def test_image_installs_the_router_the_operator_renders_for_disaggregated_services() -> None:
    from chunkpilot.operator.engines.sim import default_sim_image
    from chunkpilot.operator.router import ROUTER_COMMAND, default_router_image

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(r.startswith("vllm-router==") for r in extras["router"])
    run = " ".join(rest for keyword, rest in _instructions() if keyword == "RUN")
    # The router extra's pin is in the image's hashed lock (tests/engine/test_image_locks.py checks
    # the lock holds the extra); the image installs that lock.
    assert "--require-hashes -r engine_image/requirements/sim.txt" in run, "the image must install the router"
    router = next(r for r in extras["router"] if r.startswith("vllm-router=="))
    assert router in (REPO / "engine_image" / "requirements" / "sim.txt").read_text()
    assert f"{ROUTER_COMMAND[0]} --help" in run, "the build must check the router binary starts"
    assert default_router_image() == default_sim_image()


def test_the_image_runs_the_compiled_core_built_from_its_own_sources() -> None:
    stages = [rest for keyword, rest in _instructions() if keyword == "FROM"]
    assert stages[0].endswith(" AS core") and len(stages) == 2, stages
    copies = [
        rest for keyword, rest in _instructions() if keyword == "COPY" and rest.startswith("--from=core")
    ]
    assert copies == ["--from=core /opt/chunkpilot/sim-core /opt/chunkpilot/sim-core"]
    run = " ".join(rest for keyword, rest in _instructions() if keyword == "RUN")
    assert "CHUNKPILOT_SIM_CORE_CACHE=/opt/chunkpilot/sim-core chunkpilot sim build-core" in run
    env = " ".join(rest for keyword, rest in _instructions() if keyword == "ENV")
    assert "CHUNKPILOT_SIM_CORE_CACHE=/opt/chunkpilot/sim-core" in env, "the served image must find the build"
    # The final check refuses an image whose core does not match its installed sources.
    assert "CHUNKPILOT_SIM_CORE=compiled chunkpilot sim run" in run

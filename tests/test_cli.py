"""The ``chunkpilot`` and ``kubectl-chunkpilot`` command lines: lazy command imports, quiet pipes.

``chunkpilot --help`` is printed from the table ``chunkpilot.cli.COMMANDS`` without importing
any command module; a dispatched command imports its own module only. Output piped into a
reader that goes away (``| head -1``) ends without a traceback, with status 141 like kubectl's.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from chunkpilot import kubectl_plugin as plugin
from chunkpilot.cli import COMMANDS, Command, build_parser, dispatched_command
from chunkpilot.pipes import EXIT_BROKEN_PIPE
from chunkpilot.testing.processes import captured, run_cli

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "chat-llama-8b-sim.yaml"
# Imported by some command or other, never by the root --help nor by the plugin's argument parsing.
HEAVY = ("kopf", "aiohttp", "kubernetes", "optuna", "numpy", "pydantic", "yaml", "rich")
# Wide enough that argparse wraps no help line, so a help text can be found verbatim.
COLUMNS = "1000"

# Runs a ``main`` in a fresh interpreter; prints the captured stdout, exit code and the modules
# imported as JSON (argv[1]: the module, argv[2]: the arguments as JSON).
PROBE = """
import contextlib, importlib, io, json, sys
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        code = importlib.import_module(sys.argv[1]).main(json.loads(sys.argv[2]))
    except SystemExit as exit:
        code = exit.code
print(json.dumps({"stdout": out.getvalue(), "code": code, "modules": sorted(sys.modules)}))
"""


def probe(module: str, *args: str) -> dict[str, object]:
    """``module.main(args)`` in a new interpreter: its stdout, exit code and imported modules."""
    result = captured(
        [sys.executable, "-c", PROBE, module, json.dumps(args)], timeout=120, env={"COLUMNS": COLUMNS}
    )
    assert result.returncode == 0, result.stderr
    data: dict[str, object] = json.loads(result.stdout)
    return data


def imported(modules: object, names: tuple[str, ...]) -> list[str]:
    assert isinstance(modules, list)
    return [name for name in names if name in modules]


def subparsers_of(parser: argparse.ArgumentParser) -> argparse._SubParsersAction[argparse.ArgumentParser]:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def into_closed_pipe(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` with stdout a pipe whose reader is gone before the first write (``... | true``)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            argv, stdout=write_end, stderr=subprocess.PIPE, text=True, env=env, timeout=60, check=False
        )
    finally:
        os.close(write_end)


def test_root_help_lists_every_command_without_importing_any() -> None:
    data = probe("chunkpilot.cli", "--help")
    assert data["code"] == 0
    text = data["stdout"]
    assert isinstance(text, str) and text.startswith("usage: chunkpilot ")
    for command in COMMANDS:
        assert f"    {command.name} " in text and command.help in text, command.name
    assert imported(data["modules"], HEAVY) == []
    modules = data["modules"]
    assert isinstance(modules, list)
    assert [m for m in modules if m.startswith("chunkpilot.")] == ["chunkpilot.cli", "chunkpilot.pipes"]


def test_table_rows_are_distinct_commands() -> None:
    names = [command.name for command in COMMANDS]
    assert len(names) == len(set(names))


ROWS = [pytest.param(command, id=command.name) for command in COMMANDS]


@pytest.mark.parametrize("command", ROWS)
def test_each_module_registers_its_rows_with_their_help(command: Command) -> None:
    """The root help is the same whether the module is imported or its rows stand in for it.

    So the module adds exactly the commands its rows name, in their order, with their help.
    """
    lazy = build_parser(load=())
    loaded = build_parser(load=(command.name,))
    assert loaded.format_help() == lazy.format_help()
    # The command's full sub-parser replaced the placeholder, which knows only -h.
    full = subparsers_of(loaded).choices[command.name].format_help()
    assert full != subparsers_of(lazy).choices[command.name].format_help()


EXTENDED = [pytest.param(command, id=command.name) for command in COMMANDS if command.extensions]


def sub_command_names(parser: argparse.ArgumentParser) -> set[str]:
    return {
        name
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
        for name in action.choices
    }


@pytest.mark.parametrize("command", EXTENDED)
def test_extensions_hang_sub_commands_under_their_command(command: Command) -> None:
    bare = argparse.ArgumentParser()
    bare_commands = bare.add_subparsers()
    importlib.import_module(command.module).register(bare_commands)
    alone = sub_command_names(bare_commands.choices[command.name])
    extended = sub_command_names(subparsers_of(build_parser(load=(command.name,))).choices[command.name])
    assert alone < extended


def test_every_command_is_loaded_when_none_is_named() -> None:
    assert build_parser().format_help() == build_parser(load=()).format_help()


@pytest.mark.parametrize("command", ROWS)
def test_each_command_help_is_its_full_parser_help(command: Command, monkeypatch: pytest.MonkeyPatch) -> None:
    data = probe("chunkpilot.cli", command.name, "--help")
    assert data["code"] == 0
    monkeypatch.setenv("COLUMNS", COLUMNS)
    assert data["stdout"] == subparsers_of(build_parser()).choices[command.name].format_help()


def test_a_dispatched_command_imports_only_what_it_needs() -> None:
    data = probe("chunkpilot.cli", "sim", "--help")
    assert data["code"] == 0
    assert imported(data["modules"], ("kopf", "aiohttp", "kubernetes", "optuna")) == []
    # The simulator's flags take their defaults from the knob table, not the API's pydantic models
    # (building those was a third of a short run's start-up), and YAML is read only when asked.
    run = probe("chunkpilot.cli", "sim", "run", "--help")
    assert imported(run["modules"], ("pydantic", "yaml")) == []
    sim = next(c.module for c in COMMANDS if c.name == "sim")
    others = tuple(m for c in COMMANDS for m in (c.module, *c.extensions) if m != sim)
    assert imported(data["modules"], others) == []
    render = probe("chunkpilot.cli", "render", "--help")
    assert imported(render["modules"], tuple(m for c in COMMANDS for m in c.extensions)) == []


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        ([], None),
        (["--help"], None),
        (["--version"], None),
        (["sim", "run", "--help"], "sim"),
        (["-h", "render"], "render"),
        (["--", "bench"], "bench"),
        (["--", "--help"], None),
        (["nonsense", "sim"], None),
    ],
)
def test_dispatched_command_is_the_first_positional_argument(argv: list[str], command: str | None) -> None:
    assert dispatched_command(argv) == command


def test_an_unknown_command_is_refused_with_the_table() -> None:
    result = run_cli("nonsense")
    assert result.returncode == 2
    assert "invalid choice: 'nonsense'" in result.stderr
    assert all(repr(command.name) in result.stderr for command in COMMANDS)


def test_kubectl_plugin_help_imports_neither_kubernetes_nor_rich() -> None:
    data = probe("chunkpilot.kubectl_plugin", "--help")
    assert data["code"] == 0
    text = data["stdout"]
    assert isinstance(text, str) and text.startswith("usage: kubectl chunkpilot ")
    for name in ("trials", "status", "pause", "resume"):
        assert f"    {name} " in text
    assert imported(data["modules"], HEAVY) == []
    status = probe("chunkpilot.kubectl_plugin", "status", "--help")
    assert status["code"] == 0
    assert imported(status["modules"], HEAVY) == []


def test_render_piped_into_head_ends_without_a_traceback() -> None:
    """``chunkpilot render -f EXAMPLE | head -1``: read one line, then close the pipe."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "chunkpilot.cli", "render", "-f", str(EXAMPLE)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()
    stderr = proc.stderr.read()
    code = proc.wait(timeout=60)
    assert first == "apiVersion: apps/v1\n"
    assert stderr == ""
    # Whether the rest still fitted into the pipe before it closed is a race: 0 or 141.
    assert code in (0, EXIT_BROKEN_PIPE)


@pytest.mark.parametrize("unbuffered", [False, True], ids=["buffered", "unbuffered"])
@pytest.mark.parametrize(
    "argv",
    [
        ["chunkpilot.cli", "render", "-f", str(EXAMPLE)],
        ["chunkpilot.cli", "--help"],
        ["chunkpilot.cli", "sim", "--help"],
        ["chunkpilot.kubectl_plugin", "--help"],
    ],
    ids=["render", "help", "sim-help", "kubectl-help"],
)
def test_output_into_a_closed_pipe_ends_quietly(argv: list[str], unbuffered: bool) -> None:
    """Every write fails.

    Buffered, the failure surfaces at the latest in the entry point's flush: status 141.
    Unbuffered, argparse's help printer swallows its own write error and exits 0.
    """
    env = {key: value for key, value in os.environ.items() if key != "PYTHONUNBUFFERED"}
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    result = into_closed_pipe([sys.executable, "-m", *argv], env)
    assert result.stderr == ""
    if unbuffered and "--help" in argv:
        assert result.returncode in (0, EXIT_BROKEN_PIPE)
    else:
        assert result.returncode == EXIT_BROKEN_PIPE


# ``kubectl chunkpilot status NAME`` against a stand-in for the Kubernetes API.
STATUS_WITH_FAKE_API = """
import sys, yaml
import chunkpilot.kubectl_plugin as plugin
manifest = yaml.safe_load(open(sys.argv[1]))
plugin._get_service = lambda args: manifest
code = plugin.main(["status", manifest["metadata"]["name"]])
if sys.argv[2:] == ["--modules"]:  # report what the command imported
    print(sorted(sys.modules), file=sys.stderr)
sys.exit(code)
"""


def test_kubectl_status_into_a_closed_pipe_exits_141_quietly() -> None:
    """rich's console would exit 1 on its own; the plugin ends the same way as ``chunkpilot``."""
    shown = captured([sys.executable, "-c", STATUS_WITH_FAKE_API, str(EXAMPLE)], timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "default/chat" in shown.stdout
    result = into_closed_pipe([sys.executable, "-c", STATUS_WITH_FAKE_API, str(EXAMPLE)])
    assert result.stderr == ""
    assert result.returncode == EXIT_BROKEN_PIPE


def test_kubectl_status_renders_without_the_client_or_the_models() -> None:
    """``status`` pays for rich and the knob table, never for the Kubernetes client or pydantic models."""
    shown = captured(
        [sys.executable, "-c", STATUS_WITH_FAKE_API, str(EXAMPLE), "--modules"],
        timeout=60,
        env={"COLUMNS": COLUMNS},
    )
    assert shown.returncode == 0, shown.stderr
    assert "default/chat" in shown.stdout and "autotune on" in shown.stdout
    modules = shown.stderr
    assert "'kubernetes'" not in modules
    assert "'chunkpilot.api.inferenceservice'" not in modules and "'chunkpilot.api.common'" not in modules


def test_the_plugin_says_where_the_twins_telemetry_comes_from(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(plugin.PROMETHEUS_ENV, raising=False)
    assert plugin.main(["whatif", "chat", "--rate", "3"]) == 1
    assert "give --prometheus-url" in capsys.readouterr().out
    assert plugin.main(["whatif", "chat", "--rate", "3", "--set", "budget", "--prometheus-url", "x"]) == 1
    assert "expected KNOB=VALUE" in capsys.readouterr().out

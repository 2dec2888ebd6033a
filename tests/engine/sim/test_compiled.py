"""Which simulator core loads: a build of exactly these sources, or the Python modules.

The answers of both cores are compared with the recorded reference in ``test_core_reference.py``;
here: the build key, the choice through ``CHUNKPILOT_SIM_CORE`` and the errors that say what to do.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from chunkpilot.engine.sim import compiled

from chunkpilot.cli import main as cli_main

REFERENCE_TEST = Path(__file__).with_name("test_core_reference.py")


@pytest.fixture
def empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(compiled.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(sys, "path", list(sys.path))
    return tmp_path


def _sources(root: Path, scheduler: str) -> Path:
    (root / "profiles").mkdir(parents=True)
    (root / "scheduler.py").write_text(scheduler)
    (root / "profiles" / "loader.py").write_text("X = 1\n")
    return root


def test_the_key_follows_every_source_file_and_nothing_else(tmp_path: Path) -> None:
    root = _sources(tmp_path / "sim", "A = 1\n")
    key = compiled.sources_key(root)
    assert compiled.sources_key(root) == key
    (root / "traces.csv").write_text("not a source\n")
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "scheduler.py").write_text("stale\n")
    assert compiled.sources_key(root) == key
    (root / "profiles" / "loader.py").write_text("X = 2\n")
    assert compiled.sources_key(root) != key


def test_python_is_used_when_nothing_is_built(empty_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(compiled.MODE_ENV, raising=False)
    path = ["/pkg/sim"]
    assert compiled.activate(path) is None
    assert path == ["/pkg/sim"]


def test_a_build_of_these_sources_goes_in_front(empty_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(compiled.MODE_ENV, "auto")
    build = empty_cache / compiled.sources_key()
    build.mkdir()
    (build / compiled.MARKER).write_text("{}")
    path = ["/pkg/sim"]
    assert compiled.activate(path) == build
    assert path == [str(build / "chunkpilot" / "engine" / "sim"), "/pkg/sim"]
    assert str(build) in sys.path


def test_a_build_of_other_sources_or_an_unfinished_one_is_ignored(
    empty_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(compiled.MODE_ENV, "auto")
    stale = empty_cache / "0123456789abcdef0123"
    stale.mkdir()
    (stale / compiled.MARKER).write_text("{}")
    (empty_cache / compiled.sources_key()).mkdir()  # no marker: a build that did not finish
    path = ["/pkg/sim"]
    assert compiled.activate(path) is None
    assert path == ["/pkg/sim"]


def test_python_when_asked_even_with_a_build(empty_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    build = empty_cache / compiled.sources_key()
    build.mkdir()
    (build / compiled.MARKER).write_text("{}")
    monkeypatch.setenv(compiled.MODE_ENV, "python")
    path = ["/pkg/sim"]
    assert compiled.activate(path) is None
    assert path == ["/pkg/sim"]


def test_compiled_asked_for_but_not_built_says_how_to_build(
    empty_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(compiled.MODE_ENV, "compiled")
    with pytest.raises(ImportError, match="chunkpilot sim build-core"):
        compiled.activate([])


def test_an_unknown_mode_names_the_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(compiled.MODE_ENV, "fast")
    with pytest.raises(ImportError, match="CHUNKPILOT_SIM_CORE='fast': use one of auto, python, compiled"):
        compiled.activate([])


def test_build_core_without_a_c_compiler_fails_clearly(
    empty_cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CC", "no-such-compiler")
    assert cli_main(["sim", "build-core", "--force"]) == 1
    assert "no C compiler" in capsys.readouterr().err
    assert list(empty_cache.iterdir()) == []


def test_the_compiled_core_is_in_use_where_required() -> None:
    """``make test`` builds the core and requires it, so the reference runs compiled there."""
    if os.environ.get("CHUNKPILOT_REQUIRE_COMPILED_SIM") != "1":
        pytest.skip("CHUNKPILOT_REQUIRE_COMPILED_SIM is not set: the core in use is whichever is built")
    assert compiled.core_in_use() == "compiled", "run `chunkpilot sim build-core` (make dev does)"


def test_the_python_core_answers_as_recorded_too() -> None:
    """The reference cases again, in a process that loads the Python modules whatever is built."""
    env = {**os.environ, compiled.MODE_ENV: "python"}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            str(REFERENCE_TEST),
        ],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and "skipped" not in run.stdout


def test_configs_and_summaries_cross_process_boundaries() -> None:
    """The twin and the benchmarks send these to worker processes; compiled frozen classes need help."""
    import pickle

    from chunkpilot.engine.sim.disagg import PoolConfig, Topology
    from chunkpilot.engine.sim.engine import SimConfig
    from chunkpilot.engine.sim.offline import simulate
    from chunkpilot.engine.sim.workload import parse_workload_spec

    config = SimConfig.for_engine("sglang", max_num_batched_tokens=1024, enable_mixed_chunk=True)
    topology = Topology(PoolConfig(SimConfig()), PoolConfig(SimConfig(), replicas=2))
    summary = simulate(
        SimConfig(), parse_workload_spec("n=20,rate=inf,prompt=64,output=4"), keep_records=True
    )
    for value in (config, topology, summary):
        assert pickle.loads(pickle.dumps(value)) == value

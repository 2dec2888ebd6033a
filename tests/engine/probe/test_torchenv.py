"""The cached torch install: where it goes, how it is found again, and how failures read (no download)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from chunkpilot.engine.probe import torchenv


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(torchenv.ENV_CACHE_DIR, str(tmp_path))
    return tmp_path


def test_the_pin_is_the_probe_extra() -> None:
    assert torchenv.torch_requirement() == "torch==2.13.0"


def test_the_install_is_keyed_by_version_and_interpreter(cache: Path) -> None:
    path = torchenv.overlay_dir("torch==2.13.0")
    assert path.parent == cache / "torch"
    assert path.name.startswith(f"torch-2.13.0-cp{sys.version_info.major}{sys.version_info.minor}-")


def test_a_complete_install_is_reused_without_pip(cache: Path) -> None:
    target = torchenv.overlay_dir("torch==2.13.0")
    target.mkdir(parents=True)
    (target / ".complete").write_text("torch==2.13.0\n", encoding="utf-8")
    assert torchenv.ensure_torch(requirement="torch==2.13.0") == target


def test_a_failed_install_leaves_nothing_behind_and_says_why(cache: Path) -> None:
    missing = cache / "no-such-torch.whl"
    with pytest.raises(torchenv.TorchEnvError, match=r"pip could not install .*no-such-torch\.whl"):
        torchenv.ensure_torch(requirement=str(missing))
    assert [p.name for p in (cache / "torch").iterdir()] == [".lock"]


def test_the_install_goes_first_on_pythonpath() -> None:
    env = torchenv.probe_environment(Path("/cache/torch"), {"PYTHONPATH": "/other", "HOME": "/root"})
    assert env == {"PYTHONPATH": "/cache/torch:/other", "HOME": "/root"}
    assert torchenv.probe_environment(None, {"HOME": "/root"}) == {"HOME": "/root"}


def test_without_torch_the_probe_says_how_to_get_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if torchenv.torch_in_environment():
        pytest.skip("torch is installed in this environment")
    from chunkpilot.cli import main

    assert main(["probe", "--model", "llama-3.1-8b", "--out", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err
    assert "pip install 'chunkpilot[probe]'" in err
    assert "PYTHONPATH=$(chunkpilot probe torch-env)" in err
    assert not (tmp_path / "p.json").exists()

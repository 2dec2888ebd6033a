"""The shared builder of the cached environments: reuse, rebuild on a new recipe, logged commands."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from chunkpilot.engine import isolated_env


def _recipe(calls: list[Path]) -> isolated_env.Build:
    def build(root: Path, log: Path) -> dict[str, object]:
        calls.append(root)
        root.mkdir()
        (root / "payload").write_bytes(b"x" * 10)
        isolated_env.run([sys.executable, "-c", "print('built')"], log)
        return {"recipe": 2, "what": "test"}

    return build


def test_builds_once_then_reuses(tmp_path: Path) -> None:
    root = tmp_path / "thing-1.0"
    calls: list[Path] = []
    isolated_env.ensure_built(root, 2, _recipe(calls))
    isolated_env.ensure_built(root, 2, _recipe(calls))
    assert calls == [root]
    manifest = isolated_env.IsolatedEnv(root).manifest()
    assert manifest == {"recipe": 2, "what": "test", "size_bytes": 10}
    assert json.loads((root / "chunkpilot-env.json").read_text()) == manifest
    assert "built" in (tmp_path / "thing-1.0.log").read_text()
    assert (tmp_path / "thing-1.0.lock").is_file()


def test_a_new_recipe_revision_rebuilds_from_scratch(tmp_path: Path) -> None:
    root = tmp_path / "thing-1.0"
    root.mkdir()
    (root / "stale").write_text("old")
    isolated_env.write_manifest(root, {"recipe": 1})
    calls: list[Path] = []
    isolated_env.ensure_built(root, 2, _recipe(calls))
    assert calls == [root]
    assert not (root / "stale").exists()
    assert isolated_env.read_manifest(root)["recipe"] == 2


def test_after_sees_the_manifest_under_the_lock(tmp_path: Path) -> None:
    root = tmp_path / "thing-1.0"
    seen: list[dict[str, object]] = []

    def after(where: Path, manifest: dict[str, object], log: Path) -> None:
        assert where == root and log == tmp_path / "thing-1.0.log"
        seen.append(dict(manifest))

    isolated_env.ensure_built(root, 2, _recipe([]), after=after)
    assert seen == [isolated_env.read_manifest(root)]


class _Boom(isolated_env.IsolatedEnvError):
    pass


def test_a_failing_command_raises_the_given_error_naming_the_log(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    with pytest.raises(_Boom, match=r"command failed \(3\).*x\.log"):
        isolated_env.run([sys.executable, "-c", "import sys; print('out'); sys.exit(3)"], log, _Boom)
    assert log.read_text().startswith(f"$ {sys.executable} -c")
    assert "out" in log.read_text()


def test_cache_root_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CHUNKPILOT_ENV_CACHE", str(tmp_path))
    assert isolated_env.cache_root() == tmp_path
    monkeypatch.delenv("CHUNKPILOT_ENV_CACHE")
    assert isolated_env.cache_root() == Path.home() / ".cache" / "chunkpilot" / "envs"

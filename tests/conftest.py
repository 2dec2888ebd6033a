"""Shared pytest plugins for the whole test suite, and how the suite is spread over workers.

``make test`` runs the suite on pytest-xdist workers (``-n``, ``--dist loadfile``) in three tiers:
everything but the end-to-end tests, then the end-to-end tests, which spend most of their time
waiting on wall-clock trial windows and so run side by side, then the end-to-end tests marked
``alone``, whose verdicts rest on latencies too tight to share the CPU, by themselves. Each worker
starts its own control plane and Prometheus on free ports when a test needs them. Two rules keep
that cheap and fair:

- a test file is one unit of work (its module fixtures start once), and the real-vLLM folder is one
  unit, so one vLLM CPU server serves all of it;
- files holding end-to-end tests are handed out first, then the real-engine tier, so the longest
  runs start at once instead of trailing the rest.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest_plugins = ["chunkpilot.devcluster.fixtures", "chunkpilot.localrun.fixtures"]

#: Folders whose files share a session fixture too costly to start once per worker.
ONE_WORKER_FOLDERS = ("tests/engine/vllm_plugin/",)
#: Markers whose files go first, in this order; the rest keep their collection order.
FIRST_MARKERS = ("e2e", "vllm")


def _work_unit(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    return next((folder for folder in ONE_WORKER_FOLDERS if path.startswith(folder)), path)


def _rank(item: pytest.Item) -> int:
    marks = {mark.name for mark in item.iter_markers()}
    return next((i for i, name in enumerate(FIRST_MARKERS) if name in marks), len(FIRST_MARKERS))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest-running work units first (stable otherwise): end-to-end files, then real engines."""
    first_seen: dict[str, int] = {}
    rank: dict[str, int] = {}
    for item in items:
        unit = _work_unit(item.nodeid)
        first_seen.setdefault(unit, len(first_seen))
        rank[unit] = min(rank.get(unit, len(FIRST_MARKERS)), _rank(item))
    items.sort(key=lambda item: (rank[_work_unit(item.nodeid)], first_seen[_work_unit(item.nodeid)]))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile``, with each of :data:`ONE_WORKER_FOLDERS` one unit of work."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class LoadFileSharingFolders(LoadFileScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return _work_unit(nodeid)

    return LoadFileSharingFolders(config, log)

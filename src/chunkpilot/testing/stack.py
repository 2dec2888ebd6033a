"""One local-stack factory for the end-to-end tier: the operator and the pod runner in real time."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Final, Protocol

from chunkpilot.devcluster.controlplane import ControlPlane
from chunkpilot.devcluster.prometheus import PrometheusServer
from chunkpilot.localrun.stack import LocalStack, StackOptions

#: The tuner's pace in the end-to-end tests: a tick every 2 s, a rollout given up after 90 s.
TUNER_ENV: Final[Mapping[str, str]] = {
    "CHUNKPILOT_TUNER_INTERVAL": "2",
    "CHUNKPILOT_TUNER_ROLLOUT_TIMEOUT": "90",
}


class StartStack(Protocol):
    """Starts a local stack named ``name``; stopped when the factory's context ends."""

    def __call__(self, name: str, *, tuner: bool = True, **tuner_env: str) -> LocalStack: ...


def stack_options(state_dir: Path, *, tuner: bool = True, **tuner_env: str) -> StackOptions:
    """Real time, a quick pod restart, and the operator's tuner at the tests' pace.

    ``tuner_env`` adds to (or overrides) :data:`TUNER_ENV`; ``tuner=False`` sets none of it.
    """
    return StackOptions(
        state_dir=state_dir,
        time_scale=1.0,
        restart_backoff_s=3.0,
        operator_env={**TUNER_ENV, **tuner_env} if tuner else {},
    )


@contextlib.contextmanager
def stack_factory(
    control_plane: ControlPlane, prometheus: PrometheusServer, state_dir: Callable[[str], Path]
) -> Iterator[StartStack]:
    """A :class:`StartStack` over one control plane and Prometheus (left running at the end).

    ``state_dir(name)`` gives each stack a fresh folder (pytest's ``tmp_path_factory.mktemp``).
    """
    with contextlib.ExitStack() as stacks:

        def start(name: str, *, tuner: bool = True, **tuner_env: str) -> LocalStack:
            options = stack_options(state_dir(name), tuner=tuner, **tuner_env)
            return stacks.enter_context(
                LocalStack(options, control_plane=control_plane, prometheus=prometheus)
            )

        yield start

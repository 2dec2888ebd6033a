"""How the console scripts end when the reader of their output goes away (``... | head -1``).

Standard library only, below every layer: ``chunkpilot.cli`` and ``chunkpilot.kubectl_plugin``
both end through :func:`quiet_broken_pipe`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

# Exit status after the reader of stdout went away: 128 + SIGPIPE, the status a shell reports for
# kubectl and other Unix tools, which SIGPIPE kills in that case. Python ignores SIGPIPE and raises
# BrokenPipeError instead; its docs (signal module, "Note on SIGPIPE") then exit 1, which
# `set -o pipefail` scripts could not tell from a real failure.
EXIT_BROKEN_PIPE = 141


def quiet_broken_pipe(run: Callable[[], int]) -> int:
    """``run()``, ending quietly with :data:`EXIT_BROKEN_PIPE` when stdout's reader went away.

    stdout is flushed inside the ``try`` (also when ``run`` exits, e.g. after ``--help``), so an
    EPIPE from what is still buffered is caught here too, not at interpreter exit.
    """
    try:
        try:
            return run()
        finally:
            sys.stdout.flush()
    except BrokenPipeError:
        # The interpreter flushes stdout again at exit: point it at /dev/null so that flush of
        # what is still buffered does not raise a second time ("Exception ignored ...").
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE

"""Named kill points of the pure-text stages, for the SIGKILL-and-resume tests.

``NIPFLOW_TEST_KILL_AT`` is a comma-separated list of ``<iteration>:<stage>:<point>``; at a
listed point the process SIGKILLs itself. With ``NIPFLOW_TEST_KILL_MARKERS`` (a directory)
each point kills only once (a marker file is written first), so a resumed process gets
past it. Points: ``start`` and ``end`` of every stage, ``sample_rollouts:before_save`` and
``create_fine_tune_jobs:after_<group>``. Unset, :func:`maybe_kill` does nothing.
"""

from __future__ import annotations

import os
import signal

KILL_AT_ENV = "NIPFLOW_TEST_KILL_AT"
KILL_MARKERS_ENV = "NIPFLOW_TEST_KILL_MARKERS"


def maybe_kill(iteration: int, stage: str, point: str = "") -> None:
    """SIGKILL this process if ``<iteration>:<stage>:<point>`` is a listed kill point."""
    wanted = os.environ.get(KILL_AT_ENV)
    here = f"{iteration}:{stage}:{point}"
    if not wanted or here not in wanted.split(","):
        return
    markers = os.environ.get(KILL_MARKERS_ENV)
    if markers:
        marker = os.path.join(markers, here.replace(":", "_"))
        if os.path.exists(marker):
            return
        open(marker, "w").close()
    os.kill(os.getpid(), signal.SIGKILL)

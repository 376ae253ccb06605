"""Test-only fault injection: SIGKILL a process at named stage points of its trainers.

A child process that a resume test drives (a driver script, a flow run) calls
:func:`install_from_env` first; it reads ``NIPFLOW_TEST_KILL_AT``, a comma-separated list
of ``<iteration>:<stage>:<point>`` (the points of :mod:`nip_core.trainers.hooks`), and
registers a :class:`KillAtPoints` hook through the public
:func:`nip_core.trainers.hooks.register_point_hook`. With ``NIPFLOW_TEST_KILL_MARKERS``
(a directory) each point kills only once (a marker file is written first), so a resumed
process gets past it. Production code reads neither variable.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterable

from nip_core.trainers.hooks import TrainerHooks, register_point_hook

KILL_AT_ENV = "NIPFLOW_TEST_KILL_AT"
KILL_MARKERS_ENV = "NIPFLOW_TEST_KILL_MARKERS"


class KillAtPoints(TrainerHooks):
    """SIGKILL this process at any of ``points`` (once each when ``markers`` is a directory)."""

    def __init__(self, points: Iterable[str], markers: str | None = None):
        self.points = frozenset(p for p in points if p)
        self.markers = markers

    def at_point(self, iteration: int, stage: str, point: str) -> None:
        here = f"{iteration}:{stage}:{point}"
        if here not in self.points:
            return
        if self.markers:
            marker = os.path.join(self.markers, here.replace(":", "_"))
            if os.path.exists(marker):
                return
            open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)


def install_from_env() -> Callable[[], None] | None:
    """Register :class:`KillAtPoints` from the environment; its unregister function (None: unset)."""
    wanted = os.environ.get(KILL_AT_ENV)
    if not wanted:
        return None
    return register_point_hook(KillAtPoints(wanted.split(","), os.environ.get(KILL_MARKERS_ENV)))

"""Signal handling of the foreground commands (``nipflow ui``, ``prefect server``, ``worker``).

Supervisors (systemd, Kubernetes, SLURM, ``docker stop``) stop a process with one SIGTERM;
a terminal closes with SIGHUP; a user presses Ctrl-C. A foreground command that owns a
child (a server, a worker) turns each of these into :class:`StopRequested` in its main
thread, stops the child, and exits 0.
"""

from __future__ import annotations

import contextlib
import signal
from typing import Iterator

#: The signals a foreground command handles.
HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class StopRequested(Exception):
    """A handled signal asked the command to stop; ``args[0]`` is the signal's name."""


class ForegroundSignals:
    """What :func:`foreground_signals` yields: :meth:`shield` for the teardown."""

    def shield(self) -> None:
        """Ignore every handled signal: a second Ctrl-C or SIGTERM must not cut the teardown short."""
        for sig in HANDLED:
            signal.signal(sig, signal.SIG_IGN)


@contextlib.contextmanager
def foreground_signals(raise_on: tuple[signal.Signals, ...] = HANDLED) -> Iterator[ForegroundSignals]:
    """Raise :class:`StopRequested` in the main thread on each signal of ``raise_on``.

    Signals of :data:`HANDLED` not in ``raise_on`` keep their handler (SIGINT then stays
    Python's ``KeyboardInterrupt``). The previous handlers are restored on exit.
    """
    def stop(signum, frame):
        raise StopRequested(signal.Signals(signum).name)

    previous = {sig: signal.getsignal(sig) for sig in HANDLED}
    for sig in raise_on:
        signal.signal(sig, stop)
    try:
        yield ForegroundSignals()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

"""``nipflow worker ARGS``: ``prefect worker start ARGS`` that stops on SIGTERM.

Prefect 3.8.8's worker does not exit on one SIGTERM or SIGINT: it turns the first one
into a graceful shutdown that, idle or not, can wait for minutes, and forever once its
server is gone (it keeps retrying the API); only a second SIGINT makes it kill itself
(docs/architecture.md#prefect-worker-signals). Supervisors (systemd, Kubernetes, SLURM, docker stop) send one
SIGTERM and then wait.

:func:`run_worker` starts ``python -m prefect worker start ARGS`` in its own session and
stays in the foreground. On SIGTERM, SIGINT (Ctrl-C) or SIGHUP it sends the worker a
SIGINT (the graceful request), waits :data:`GRACE_S`, sends the second SIGINT (Prefect's
own hard stop), waits :data:`HARD_S`, and then SIGKILLs the worker's process group. The
flow runs a process worker started run in their own sessions; they notice that their
worker is gone and report themselves Crashed (the crash automation reschedules training
runs). Returns 0 after a requested stop, else the worker's own exit status.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Sequence

from flows.signals import StopRequested, foreground_signals

#: Seconds the worker gets after the first SIGINT before the second one.
GRACE_S = 5.0
#: Seconds after the second SIGINT before the worker's process group is SIGKILLed.
HARD_S = 3.0


def worker_command(args: Sequence[str]) -> list[str]:
    """``python -m prefect worker start ARGS`` with this interpreter."""
    return [sys.executable, "-m", "prefect", "worker", "start", *args]


def _wait(proc: subprocess.Popen, timeout: float) -> bool:
    try:
        proc.wait(timeout)
        return True
    except subprocess.TimeoutExpired:
        return False


def _signal(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def stop_worker(proc: subprocess.Popen, grace: float = GRACE_S, hard: float = HARD_S) -> str:
    """Stop ``proc`` (a worker in its own session); returns how: ``sigint``, ``sigint2`` or ``sigkill``."""
    for how, wait in (("sigint", grace), ("sigint2", hard)):
        if proc.poll() is not None:
            return how
        _signal(proc, signal.SIGINT)
        if _wait(proc, wait):
            return how
    _signal(proc, signal.SIGKILL)
    proc.wait()
    return "sigkill"


def run_worker(args: Sequence[str]) -> int:
    """Run the worker in the foreground until it exits or a signal stops it."""
    proc = None
    with foreground_signals() as signals:
        try:
            proc = subprocess.Popen(worker_command(args), stdin=subprocess.DEVNULL, start_new_session=True)
            return proc.wait()
        except StopRequested as e:
            if proc is None:
                return 0
            started = time.monotonic()
            print(f"nipflow worker: {e.args[0]}: stopping the Prefect worker (pid {proc.pid})", file=sys.stderr,
                  flush=True)
            signals.shield()
            how = stop_worker(proc)
            print(f"nipflow worker: stopped ({how}) after {time.monotonic() - started:.1f} s", file=sys.stderr)
            return 0
        finally:
            if proc is not None and proc.poll() is None:  # any other way out leaves no worker behind
                stop_worker(proc, grace=0.5, hard=0.5)

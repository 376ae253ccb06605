"""Preemption: SIGTERM, SIGUSR1, SIGHUP and Ctrl-C stop TensorDict training cleanly and resumably.

Clusters preempt jobs with a signal and a grace period: SLURM sends SIGTERM (or, with
``#SBATCH --signal=USR1@90``, SIGUSR1 ahead of time), Kubernetes SIGTERM, a user Ctrl-C,
a closing terminal SIGHUP (left alone where it is ignored, as under ``nohup``).
While a :class:`PreemptionGuard` is active the first such signal only sets a flag. The
training loop looks at it after every minibatch step; when it is set, the loop stops
there, the checkpoint of the **last finished iteration** (kept in memory since that
iteration ended) is written to the run store if it is not there yet, and
:class:`TrainingPreempted` is raised. A resumed run starts from that checkpoint and ends
bit-identical to an uninterrupted one: the partial iteration is thrown away, never mixed
in. ``nipflow`` exits with status :data:`PREEMPTED_EXIT_CODE` (75, ``EX_TEMPFAIL``:
"temporary failure, try again"), which a SLURM script can turn into a requeue; a
Prefect flow run fails with the exception, and the RL block's retries continue it.

A second Ctrl-C while stopping raises ``KeyboardInterrupt`` at once. Handlers can only
be installed from the main thread; elsewhere (a Prefect task in a worker thread) the guard
does nothing and the process keeps its default signal behaviour.
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType
from typing import Any

from nip_core.errors import TrainingPreempted  # raised here; defined with the other errors

log = logging.getLogger(__name__)

PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT, signal.SIGHUP)
PREEMPTED_EXIT_CODE = 75  # EX_TEMPFAIL


class PreemptionGuard:
    """Turns the preemption signals into a flag for the duration of a ``with`` block."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now
        if self.signum is None:
            log.warning("%s received: stopping after the current minibatch step and checkpointing",
                        signal.Signals(signum).name)
        self.signum = signum

    def __enter__(self) -> "PreemptionGuard":
        if threading.current_thread() is not threading.main_thread():
            return self
        for signum in PREEMPTION_SIGNALS:
            if signum == signal.SIGHUP and signal.getsignal(signum) is signal.SIG_IGN:
                continue  # nohup: a hang-up must not stop the training
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

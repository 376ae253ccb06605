"""Signal handling of the ``nipflow`` commands.

Supervisors (systemd, Kubernetes, SLURM, ``docker stop``) stop a process with one SIGTERM;
a terminal closes with SIGHUP; a user presses Ctrl-C. A foreground command that owns a
child (``nipflow ui``, ``prefect server``, ``worker``) turns each of these into
:class:`StopRequested` in its main thread, stops the child, and exits 0
(:func:`foreground_signals`). ``nipflow run``, ``resume`` and ``sweep`` stop on each of
them as on Ctrl-C, and exit with the shell's status for the signal, 128 + its number
(:func:`stop_like_ctrl_c`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from types import FrameType
from typing import Any, Callable, Iterator

#: The signals a foreground command handles.
HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class StopRequested(Exception):
    """A handled signal asked the command to stop; ``args[0]`` is the signal's name."""


# -- a stop that Python swallowed is delivered again ------------------------------------------------
# A handler's exception is raised in whatever the main thread runs between two bytecodes. When that
# is a weakref callback, a __del__ or a garbage-collector callback, Python prints "Exception ignored
# in ..." (sys.unraisablehook) and carries on: the stop is lost, and the command would train on.
# While a handler block is active, such a lost stop exception is noticed in sys.unraisablehook and
# its signal is sent to the main thread again, shortly after, from a helper thread.

#: Seconds between a lost stop and its new delivery (the main thread leaves the callback first).
REDELIVER_AFTER_S = 0.01

_hook_users = 0
_chained_hook: Callable[[Any], None] | None = None


def _on_unraisable(unraisable: Any) -> None:
    lost = getattr(unraisable.exc_value, "nipflow_when_lost", None)
    if lost is None:
        (_chained_hook or sys.__unraisablehook__)(unraisable)
        return
    signum, forget = lost
    forget()  # the handler must raise again when the signal comes back
    threading.Thread(target=_redeliver, args=(signum,), name="nipflow-redeliver-stop", daemon=True).start()


def _redeliver(signum: int) -> None:
    time.sleep(REDELIVER_AFTER_S)
    try:
        signal.pthread_kill(threading.main_thread().ident, signum)
    except (OSError, TypeError):
        pass  # the main thread is gone: the process is ending anyway


@contextlib.contextmanager
def _redelivering_lost_stops() -> Iterator[None]:
    global _hook_users, _chained_hook
    if _hook_users == 0:
        _chained_hook, sys.unraisablehook = sys.unraisablehook, _on_unraisable
    _hook_users += 1
    try:
        yield
    finally:
        _hook_users -= 1
        if _hook_users == 0:
            if sys.unraisablehook is _on_unraisable:  # not replaced meanwhile
                sys.unraisablehook = _chained_hook or sys.__unraisablehook__
            _chained_hook = None


def _stop_with(error: BaseException, signum: int, forget: Callable[[], None] = lambda: None) -> BaseException:
    """``error``, marked so that :func:`_on_unraisable` delivers ``signum`` again if Python swallows it."""
    error.nipflow_when_lost = (signum, forget)
    return error


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
        raise _stop_with(StopRequested(signal.Signals(signum).name), signum)

    previous = {sig: signal.getsignal(sig) for sig in HANDLED}
    for sig in raise_on:
        signal.signal(sig, stop)
    try:
        with _redelivering_lost_stops():
            yield ForegroundSignals()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class Interrupted(KeyboardInterrupt):
    """A run stopped by SIGTERM, SIGHUP or Ctrl-C, as Ctrl-C stops it (a ``KeyboardInterrupt``).

    ``signum`` is the signal; :attr:`exit_status` is the shell's status for it (128 + signum:
    130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP).
    """

    def __init__(self, signum: int):
        self.signum = int(signum)
        super().__init__(f"stopped by {signal.Signals(self.signum).name}")

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


class Preempted(Interrupted):
    """TensorDict training checkpointed its last finished iteration and stopped on a signal,
    inside a flow run: the process was asked to stop, so neither Prefect's retries of the RL
    block nor anything else may carry on training in it. A ``KeyboardInterrupt`` (a
    ``BaseException``), so Prefect ends the flow runs Crashed without retrying them (a
    deployed block is rescheduled by the crash automation and resumes from the checkpoint);
    ``nipflow`` exits with the preemption status (75, as ``--direct`` does)."""

    def __init__(self, signum: int, message: str):
        super().__init__(signum)
        self.args = (message,)

    @property
    def exit_status(self) -> int:
        from nip_core.trainers.preemption import PREEMPTED_EXIT_CODE

        return PREEMPTED_EXIT_CODE


class StopSignals:
    """What :func:`stop_like_ctrl_c` yields: which signal stopped the command, and :meth:`shield`."""

    def __init__(self) -> None:
        self.received: int | None = None
        self.shielded = False

    def handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is None and not self.shielded:
            self.received = signum
            self.shielded = True  # the first signal stops the command; the cleanup then runs to its end
            raise _stop_with(Interrupted(signum), signum, self._lost)
        # os.write, not print: a handler that runs while the main thread is writing to stderr
        # would make a buffered write re-entrant (RuntimeError), cutting the clean-up short
        try:
            os.write(2, f"nipflow: {signal.Signals(signum).name} ignored: stopping already (cleaning up)\n".encode())
        except OSError:
            pass

    def shield(self) -> None:
        """From now on ignore every handled signal (the command's cleanup has begun)."""
        self.shielded = True

    def _lost(self) -> None:
        """Python swallowed the stop (raised inside a weakref callback or ``__del__``): no stop yet."""
        self.received, self.shielded = None, False


#: The :func:`stop_like_ctrl_c` blocks active in this process.
_active: list[StopSignals] = []


def shield_active_stop() -> None:
    """A clean-up begins (training stopped by the preemption guard, or failed): from now on the
    active :func:`stop_like_ctrl_c` block, if any, ignores stop signals."""
    for stop in _active:
        stop.shield()


@contextlib.contextmanager
def stop_like_ctrl_c() -> Iterator[StopSignals]:
    """``nipflow run``/``resume``/``sweep``: SIGTERM and SIGHUP stop the command like Ctrl-C.

    The first of SIGINT, SIGTERM and SIGHUP raises :class:`Interrupted` (a
    ``KeyboardInterrupt``) in the main thread, wherever it is (starting Prefect's temporary
    server, waiting for fine-tune jobs, between sweep points), so that the command's
    ``finally`` blocks and ``atexit`` hooks run: the local API server and Prefect's temporary
    server are stopped, the run store records the invocation as interrupted. Every later
    signal is ignored (with a line on stderr), also after this block when a signal stopped
    the command: the process is ending, and the ``atexit`` hooks must not be cut short
    either. Without a signal the previous handlers come back on exit. A stop that lands in a
    weakref callback or a ``__del__`` (where Python only prints "Exception ignored") is raised
    again shortly after, outside it.

    A signal whose disposition is ``SIG_IGN`` (SIGHUP under ``nohup``, SIGINT in a background
    job of a non-interactive shell) stays ignored, and a SIGINT handler other than Python's
    default is kept. Inside TensorDict training the preemption guard
    (:mod:`nip_core.trainers.preemption`) takes over SIGINT, SIGTERM and SIGHUP, checkpoints
    and raises ``TrainingPreempted``; a Prefect flow run turns SIGTERM into Prefect's
    ``TerminationSignal`` and then delivers it again here, after recording the crash.
    """
    stop = StopSignals()
    if threading.current_thread() is not threading.main_thread():
        yield stop  # handlers can only be installed from the main thread: the defaults stay
        return
    previous = {sig: signal.getsignal(sig) for sig in HANDLED}
    for sig, handler in previous.items():
        if handler is signal.SIG_DFL or (sig == signal.SIGINT and handler is signal.default_int_handler):
            signal.signal(sig, stop.handle)
    _active.append(stop)
    try:
        with _redelivering_lost_stops():
            yield stop
    finally:
        _active.remove(stop)
        if stop.received is None:
            for sig, handler in previous.items():
                if signal.getsignal(sig) == stop.handle:  # not replaced meanwhile (a bound method: ==)
                    signal.signal(sig, handler)

"""Driving a run: the one place where a driver takes a run's lease, reloads its state and records itself.

A *driver* is whatever makes a run progress: ``nipflow run --direct`` (``flows/cli.py``), a
``train_experiment`` flow run (``flows/experiment.py``) or an RL block run as its own flow
run (``flows/rl_blocks.py``). Each one wraps its work in :func:`driving_run`, which

1. holds the run's lease (:class:`~nip_core.runs.lock.RunLock`) for the body: re-entered
   when this process already holds it (a local subflow), joined when the driver works under
   its parent's claim (an RL block), otherwise taken — waiting for a live holder, taking over
   an expired one (``before_acquire`` runs first: a flow run waits there for an earlier
   attempt of itself);
2. re-reads the trainer's state after taking the lease (the trainer was built before; a
   previous driver may have moved the run on meanwhile);
3. records the invocation in the run's ``metadata.json`` (``record``: ``"direct"`` or
   ``"flow"``) and, however the body ends, how it ended (``outcome_of`` the error), then runs
   ``after`` (the caller's result card) before the lease is let go.

Recording never stops training: a failure to write the record is logged. A run that is not
stored (``NullRun``) has no lease and no records. Prefect stays outside: the flows pass their
Prefect-aware ``outcome_of`` and ``after``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from nip_core.runs.invocations import begin_invocation, end_invocation
from nip_core.runs.invocations import outcome_of as default_outcome_of

log = logging.getLogger(__name__)


@contextmanager
def driving_run(trainer: Any, record: str | None = None, *, claim: dict[str, Any] | None = None,
                before_acquire: Callable[[Any], None] | None = None,
                details: dict[str, Any] | None = None,
                outcome_of: Callable[[BaseException], tuple[str, str | None]] = default_outcome_of,
                after: Callable[[], None] | None = None) -> Iterator[Any]:
    """Hold ``trainer``'s run for the body of the ``with``; yields the run's lock (``None`` if not stored).

    Parameters
    ----------
    trainer
        The built trainer: its ``run`` and ``reload_state()`` are used.
    record
        ``"direct"`` or ``"flow"``: record the invocation in ``metadata.json`` (``None``: an
        RL block, which is part of its parent's invocation).
    claim
        ``{"owner", "generation"}`` of a parent driver's lease to work under.
    before_acquire
        Called with the lock before the lease is taken (not when re-entered or joined).
    details
        Extra fields of the invocation record (``flow_run_id``, ``prefect_ui``).
    outcome_of
        ``(status, message)`` of the error the body ended with.
    after
        Called after the invocation's end is recorded, before the lease is released
        (however the body ended; its own errors are logged, never raised over the body's).
    """
    run = trainer.run
    if not run.persistent:
        try:
            yield None
        finally:
            _quietly(after, run)
        return
    lock = run.lock
    reentered = lock.held
    if not reentered and claim:
        lock.join(str(claim["owner"]), int(claim["generation"]))
    else:
        if not reentered and before_acquire is not None:
            before_acquire(lock)
        lock.acquire()
    index, status, message = None, "completed", None
    try:  # from here on, however it ends (a stop signal included), the lease is let go
        if not reentered:
            trainer.reload_state()
        if record:
            index = _begin(run, record, details)
        yield lock
    except BaseException as e:
        status, message = outcome_of(e)
        raise
    finally:
        if index is not None:
            _quietly(lambda: end_invocation(run, index, status, message), run)
        _quietly(after, run)
        lock.release()


def _begin(run: Any, record: str, details: dict[str, Any] | None) -> int | None:
    try:
        return begin_invocation(run, record, **(details or {}))
    except Exception as e:  # noqa: BLE001 - recording must never stop training
        log.warning("could not record the start of run %s in its metadata: %s", run.run_id, e)
        return None


def _quietly(action: Callable[[], None] | None, run: Any) -> None:
    if action is None:
        return
    try:
        action()
    except Exception as e:  # noqa: BLE001 - never hide the body's error behind a recording one
        log.warning("could not record the end of run %s or publish its result card: %s", run.run_id, e)

"""Holding a run's lease around the work of a flow run (see :mod:`nip_core.runs.lock`).

The experiment flow takes the run's lease for as long as it drives the run (released
when it ends, fails or suspends itself for a fine-tune wait). An RL block that runs as
its own flow run — maybe on another worker, maybe on another host — joins the parent's
claim, passed in its :class:`~flows.parameters.RunSpec`, and renews it while it trains;
a block whose parent lost the lease (another driver took the run over) fails at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from nip_core.runs.lock import RunLock


@contextmanager
def driving(trainer: Any, claim: dict[str, Any] | None = None) -> Iterator[RunLock]:
    """Hold the lease of ``trainer``'s run for the body of the ``with``.

    Re-enters the lease when this process already holds it (a local subflow), joins
    ``claim`` (``{"owner", "generation"}`` of the parent flow run) when given, and
    otherwise takes the lease, waiting for an expired holder's claim to lapse. A newly
    taken lease is followed by a re-read of the trainer's state (the trainer was built
    before; a previous driver may have moved the run on meanwhile).
    """
    lock = trainer.run.lock
    reentered = lock.held
    if not reentered and claim:
        lock.join(str(claim["owner"]), int(claim["generation"]))
    else:
        lock.acquire()
    if not reentered:
        trainer.reload_state()
    try:
        yield lock
    finally:
        lock.release()

"""Holding a run's lease around the work of a flow run (see :mod:`nip_core.runs.lock`).

The experiment flow takes the run's lease for as long as it drives the run (released
when it ends, fails or suspends itself for a fine-tune wait), through the one run driver of
the domain library (:mod:`nip_core.runs.driving`, which ``nipflow run --direct`` uses too). An RL block that runs as
its own flow run — maybe on another worker, maybe on another host — joins the parent's
claim, passed in its :class:`~flows.parameters.RunSpec`, and renews it while it trains;
a block whose parent lost the lease (another driver took the run over) fails at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from nip_core.runs.driving import driving_run
from nip_core.runs.lock import RunLock

log = logging.getLogger(__name__)


#: seconds a flow run waits, at most, for the claim of an earlier attempt of itself to end
#: (an RL block that attempt started may still be training under it)
PREDECESSOR_WAIT_S = 6 * 3600.0


@contextmanager
def driving(trainer: Any, claim: dict[str, Any] | None = None, **recording: Any) -> Iterator[RunLock]:
    """Drive ``trainer``'s run in a flow run: :func:`nip_core.runs.driving.driving_run` with the
    flow runs' wait for an earlier attempt of themselves before the lease is taken.

    ``claim`` (``{"owner", "generation"}`` of the parent flow run) is joined when given (an RL
    block); ``recording`` is passed on (``record="flow"``, ``details``, ``outcome_of``, ``after``:
    see :func:`flows.observability.flow_recording`).

    Inside a flow run, the claim names the flow run. A flow run that runs again after its
    host died (rescheduled by the crash automation, same flow-run id) may find its earlier
    attempt's claim still renewed: by an RL block that attempt started, which joined the
    claim and trains on. It waits for that claim to end (up to :data:`PREDECESSOR_WAIT_S`)
    instead of failing after 1.5 ttl as it would for another driver; the block it then
    asks for again is the same flow run, done (:func:`flows.rl_blocks.block_idempotency_key`).
    """
    with driving_run(trainer, claim=claim, before_acquire=_wait_for_predecessor, **recording) as lock:
        yield lock


def _wait_for_predecessor(lock: RunLock) -> None:
    from prefect.runtime import flow_run

    this_run = flow_run.id
    if not this_run:
        return
    lock.describe["flow_run_id"] = str(this_run)
    deadline = time.monotonic() + PREDECESSOR_WAIT_S
    logged = False
    while time.monotonic() < deadline:
        view = lock.view()
        if view.expired(lock.clock()) or view.holder.get("flow_run_id") != str(this_run):
            return
        if not logged:
            log.info("run %s: the lease is held under an earlier attempt of this flow run (generation %d; an RL "
                     "block it started may still be training): waiting for that claim to end", lock.run_id,
                     view.generation)
            logged = True
        time.sleep(min(lock.ttl_s / 6.0, 10.0))

"""The run lease: one driver per run, whatever process or host it runs on.

Every driver of a run (``nipflow run --direct``, a flow run, an RL block on another
worker) holds the lease ``leases/run`` of the run's storage while it works; see
:mod:`nip_core.runs.lease` for the protocol. A driver that finds the lease held waits
up to ``wait_s`` (by default one and a half ttl, so that the claim of a driver that
crashed expires meanwhile) and then fails with :class:`RunLockedError` naming the
holder and when its claim expires. A child flow run (an RL block) *joins* its parent's
claim instead of taking a new one (:meth:`Lease.join`).

A driver that takes the run over from one that never released it seals the run's mutable
files first (:func:`nip_core.runs.fencing.seal`), so that the old driver, if it was only
paused, can never change what the new one reads.
"""

from __future__ import annotations

import logging

from nip_core.runs import fencing
from nip_core.runs.lease import Lease
from nip_core.runs.storage import Storage

log = logging.getLogger(__name__)
RUN_LEASE = "run"


class RunLock(Lease):
    """The lease on a whole run (re-entrant within one object)."""

    def __init__(self, storage: Storage, run_id: str, ttl_s: float | None = None):
        super().__init__(storage, RUN_LEASE, ttl_s=ttl_s, describe={"run_id": run_id}, label=f"{run_id}")
        self.run_id = run_id

    def acquire(self, wait_s: float | None = None, poll_s: float = 0.25) -> "RunLock":
        """Take the run's lease and keep renewing it (wait default: 1.5 ttl)."""
        if wait_s is None:
            wait_s = 1.5 * self.ttl_s
        if not self._depth:
            current = self.view()
            if current.owner is not None and not current.expired(self.clock()):
                log.info("run %s: waiting up to %.0f s for the lease held by %s", self.run_id, wait_s,
                         ", ".join(f"{k}={v}" for k, v in current.holder.items()))
        super().acquire(wait_s, poll_s)
        self.keep_alive()
        return self

    def _prepare_takeover(self, epoch: int) -> None:
        sealed = fencing.seal(self.storage, epoch)
        if sealed:
            log.info("run %s: sealed %d mutable file(s) into epoch %d before taking over", self.run_id,
                     len(sealed), epoch)

    def join(self, owner: str, generation: int) -> "RunLock":
        super().join(owner, generation)
        self.keep_alive()
        return self

    def claim(self) -> dict[str, object] | None:
        """``{"owner", "generation"}`` for a child flow run to join, or None if not held."""
        if not self.held or self.generation is None:
            return None
        return {"owner": self.token, "generation": self.generation}

"""Prefect's transaction lock manager on run-store leases.

Stage tasks run in SERIALIZABLE transactions, so that two processes racing on one stage
execute it once. Prefect's file lock manager writes locks without expiry that only
processes on one host see, so a SIGKILLed holder blocked every later attempt and another
host never saw the lock. Here each transaction lock is a :class:`~nip_core.runs.lease.Lease`
in the run's own storage (``leases/stages/<key>``): expiring, renewed while held, taken
over only once expired, valid across hosts and on object stores; an empty or torn lock
file counts as free. The run lease (one driver per run) makes contention rare; these
locks keep a stage's cache record and its execution together when it does happen.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from typing import Optional

from prefect.locking.protocol import LockManager

from nip_core.errors import RunLockedError
from nip_core.runs.lease import Lease
from nip_core.runs.storage import Storage


class LeaseLockManager(LockManager):
    """A Prefect ``LockManager`` whose locks are leases in ``storage``.

    Parameters
    ----------
    storage
        The run's storage; locks live under ``leases/stages/``.
    ttl_s
        Lease ttl (renewed every third of it while the transaction runs); default the
        run lease's (``$NIPFLOW_LEASE_TTL_S`` or 60 s).
    """

    def __init__(self, storage: Storage, ttl_s: Optional[float] = None):
        self.storage = storage
        self.ttl_s = ttl_s
        self._held: dict[tuple[str, str], Lease] = {}
        self._mutex = threading.Lock()

    def _lease(self, key: str) -> Lease:
        return Lease(self.storage, f"stages/{key}", ttl_s=self.ttl_s, label=f"stage lock {key}")

    def acquire_lock(self, key: str, holder: str, acquire_timeout: Optional[float] = None,
                     hold_timeout: Optional[float] = None) -> bool:
        with self._mutex:
            if (key, holder) in self._held:
                return True
        lease = self._lease(key)
        lease.describe["holder"] = holder
        try:
            lease.acquire(wait_s=math.inf if acquire_timeout is None else acquire_timeout)
        except RunLockedError:
            return False
        lease.keep_alive()
        with self._mutex:
            self._held[(key, holder)] = lease
        return True

    async def aacquire_lock(self, key: str, holder: str, acquire_timeout: Optional[float] = None,
                            hold_timeout: Optional[float] = None) -> bool:
        return await asyncio.to_thread(self.acquire_lock, key, holder, acquire_timeout, hold_timeout)

    def release_lock(self, key: str, holder: str) -> None:
        with self._mutex:
            lease = self._held.pop((key, holder), None)
        if lease is None:
            raise ValueError(f"No lock held by {holder} for transaction with key {key}")
        lease.release()

    def is_locked(self, key: str, use_cache: bool = False) -> bool:
        current = self._lease(key).view()
        return not current.expired(time.time())

    def is_lock_holder(self, key: str, holder: str) -> bool:
        with self._mutex:
            lease = self._held.get((key, holder))
        if lease is None or not lease.held:
            return False
        current = lease.view()
        return current.owner == lease.token and current.generation == lease.generation

    def wait_for_lock(self, key: str, timeout: Optional[float] = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.is_locked(key):
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.1)
        return True

    async def await_for_lock(self, key: str, timeout: Optional[float] = None) -> bool:
        return await asyncio.to_thread(self.wait_for_lock, key, timeout)

    def __repr__(self) -> str:  # Prefect logs lock managers; keep it short
        return f"LeaseLockManager({self.storage.url()!r})"



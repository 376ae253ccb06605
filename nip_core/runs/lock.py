"""A lock that stops a second process from driving the same run.

The lock is a file created with ``O_EXCL`` holding the holder's pid, host and start
time. A lock whose holder is a dead process on this host is stale and taken over; a
lock held by a live process (or by another host, whose liveness we cannot check) is
refused with :class:`RunLockedError` naming the holder.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from datetime import datetime, timezone

from nip_core.errors import RunLockedError
from nip_core.runs.storage import Storage
from nip_core.utils.fileio import pid_alive

LOCK_FILE = "run.lock"


class RunLock:
    """Exclusive, re-entrant (within one process) lock on a run directory."""

    def __init__(self, storage: Storage, run_id: str):
        self.storage = storage
        self.run_id = run_id
        self.token = uuid.uuid4().hex
        self._depth = 0

    def _holder(self) -> dict | None:
        try:
            return json.loads(self.storage.read_bytes(LOCK_FILE))
        except FileNotFoundError:
            return None
        except (ValueError, UnicodeDecodeError):
            return {"pid": -1, "host": "?", "note": "unreadable lock file"}

    def _is_stale(self, holder: dict) -> bool:
        if holder.get("host") == socket.gethostname():
            pid = int(holder.get("pid", -1))
            return pid != os.getpid() and (pid <= 0 or not pid_alive(pid))
        return False

    def acquire(self, timeout_s: float = 0.0, poll_s: float = 0.2) -> None:
        """Take the lock, waiting up to ``timeout_s`` for a live holder to release it."""
        if self._depth:
            self._depth += 1
            return
        record = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "acquired_at": datetime.now(timezone.utc).isoformat(),
            "token": self.token,
        }
        deadline = time.monotonic() + timeout_s
        while True:
            if self.storage.create_exclusive(LOCK_FILE, json.dumps(record).encode()):
                self._depth = 1
                return
            holder = self._holder()
            if holder is None:
                continue
            if holder.get("token") == self.token:
                self._depth = 1
                return
            if holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
                # Same process, another RunLock object (e.g. a second trainer on the run).
                raise RunLockedError(self.run_id, {**holder, "note": "held by this process"},
                                     self.storage.full(LOCK_FILE))
            if self._is_stale(holder):
                self.storage.remove(LOCK_FILE)
                continue
            if time.monotonic() >= deadline:
                raise RunLockedError(self.run_id, holder, self.storage.full(LOCK_FILE))
            time.sleep(poll_s)

    def release(self) -> None:
        if not self._depth:
            return
        self._depth -= 1
        if self._depth:
            return
        holder = self._holder()
        if holder and holder.get("token") == self.token:
            self.storage.remove(LOCK_FILE)

    @property
    def held(self) -> bool:
        return self._depth > 0

    def __enter__(self) -> "RunLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

"""A Prefect file lock manager that takes over locks left by dead processes.

Prefect's ``FileSystemLockManager`` writes locks without an expiry, so a process that is
SIGKILLed inside a SERIALIZABLE transaction leaves a lock that every later run of that
stage waits on forever. This manager also records the holder's pid and host next to the
lock; a lock whose holder is a dead process on this host is stale and removed. Locks of
other hosts are respected (their liveness cannot be checked from here).
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Optional

from prefect.locking.filesystem import FileSystemLockManager

from nip_core.utils.fileio import pid_alive


class StaleAwareLockManager(FileSystemLockManager):
    """``FileSystemLockManager`` plus pid/host owner files for stale-lock takeover."""

    def _owner_path(self, key: str) -> Path:
        return Path(str(self._lock_path_for_key(key)) + ".owner")

    def acquire_lock(self, key: str, holder: str, acquire_timeout: Optional[float] = None,
                     hold_timeout: Optional[float] = None) -> bool:
        acquired = super().acquire_lock(key, holder, acquire_timeout, hold_timeout)
        if acquired:
            tmp = self._owner_path(key).with_suffix(".owner.tmp")
            tmp.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "holder": holder}))
            os.replace(tmp, self._owner_path(key))
        return acquired

    def release_lock(self, key: str, holder: str) -> None:
        super().release_lock(key, holder)
        self._owner_path(key).unlink(missing_ok=True)

    def _holder_is_dead(self, key: str) -> bool:
        try:
            owner = json.loads(self._owner_path(key).read_text())
        except (OSError, ValueError):
            return False  # no owner file yet: the holder is between touch and write
        return (owner.get("host") == socket.gethostname() and owner.get("pid") != os.getpid()
                and not pid_alive(int(owner.get("pid", 0))))

    def is_locked(self, key: str, use_cache: bool = False) -> bool:
        locked = super().is_locked(key, use_cache=use_cache)
        if locked and self._holder_is_dead(key):
            self._lock_path_for_key(key).unlink(missing_ok=True)
            self._owner_path(key).unlink(missing_ok=True)
            self._locks.pop(key, None)
            return False
        return locked

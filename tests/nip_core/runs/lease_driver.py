"""A run driver for the multi-process lease tests: ``python lease_driver.py ROLE LOCATION RUN_ID TTL SECONDS``.

It opens the store exactly as a driver does (``Storage(LOCATION)``, fsspec's defaults
otherwise: nothing here touches caches) and prints one JSON line per event.

``holder``
    Takes the run lease (no waiting), keeps it renewed by the lease's own thread and
    checks it every 50 ms for at least SECONDS and until its stdin is closed; then
    prints ``held`` and releases it. Exits 3 with ``lost`` if the lease is lost.
``contender``
    Prints ``ready`` once imported, waits for a line on stdin (so that the test decides
    when its first look at the store happens), then tries ``RunLock.acquire(wait_s=SECONDS)``
    once: prints ``took`` (exit 0) or ``refused`` (exit 0), or ``crashed`` with the
    exception type (exit 2).
``reader``
    Reads the object ``state.json`` once and prints ``read`` or ``read-failed`` with the
    exception type and how long the call took (SECONDS and TTL are not used).
"""

from __future__ import annotations

import json
import sys
import threading
import time


def _say(event: str, **fields: object) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def _holder(lock, seconds: float) -> int:
    from nip_core.runs.lease import LeaseLostError

    lock.acquire(wait_s=0)
    _say("locked", generation=lock.generation, at=time.time())
    stdin_closed = threading.Event()

    def drain() -> None:
        sys.stdin.read()
        stdin_closed.set()

    threading.Thread(target=drain, daemon=True).start()
    started = time.monotonic()
    try:
        while time.monotonic() - started < seconds or not stdin_closed.is_set():
            lock.check()
            time.sleep(0.05)
        lock.check()
    except LeaseLostError as e:
        _say("lost", at=time.time(), after_s=round(time.monotonic() - started, 2), reason=str(e))
        return 3
    _say("held", generation=lock.generation, held_s=round(time.monotonic() - started, 2))
    lock.release()
    return 0


def _contender(lock, seconds: float) -> int:
    from nip_core.errors import RunLockedError

    _say("ready")
    sys.stdin.readline()
    started = time.monotonic()
    try:
        lock.acquire(wait_s=seconds)
    except RunLockedError as e:
        _say("refused", after_s=round(time.monotonic() - started, 2), message=str(e))
        return 0
    except Exception as e:  # noqa: BLE001 - reported to the test, which fails on it
        _say("crashed", type=type(e).__name__, message=str(e))
        return 2
    _say("took", generation=lock.generation, after_s=round(time.monotonic() - started, 2))
    lock.release()
    return 0


def _reader(storage) -> int:
    started = time.monotonic()
    try:
        data = storage.read_bytes("state.json")
    except Exception as e:  # noqa: BLE001 - reported to the test
        _say("read-failed", type=type(e).__name__, took_s=round(time.monotonic() - started, 2))
        return 0
    _say("read", size=len(data), took_s=round(time.monotonic() - started, 2))
    return 0


def main(argv: list[str]) -> int:
    role, location, run_id, ttl, seconds = argv
    from nip_core.runs.lock import RunLock
    from nip_core.runs.storage import Storage

    if role == "reader":
        return _reader(Storage(location))
    lock = RunLock(Storage(location), run_id, ttl_s=float(ttl))
    return (_holder if role == "holder" else _contender)(lock, float(seconds))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Leases: one holder at a time, expiry-based takeover, fencing by generation; local and S3."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nip_core.errors import RunLockedError
from nip_core.runs.lease import Lease, LeaseLostError
from nip_core.runs.storage import Storage

REPO = Path(__file__).resolve().parents[3]


class Clock:
    def __init__(self, t: float = 1_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_a_held_lease_is_refused_until_it_expires_then_taken_over(tmp_path):
    clock = Clock()
    storage = Storage(str(tmp_path))
    a = Lease(storage, "run", ttl_s=30, clock=clock).acquire()
    b = Lease(storage, "run", ttl_s=30, clock=clock)
    with pytest.raises(RunLockedError) as info:
        b.acquire()
    assert "generation=1" in str(info.value) and "expires_in_s=30.0" in str(info.value)
    clock.t += 29.9
    with pytest.raises(RunLockedError):
        b.acquire()
    clock.t += 0.2
    b.acquire()
    assert (a.generation, b.generation) == (1, 2)
    with pytest.raises(LeaseLostError, match="generation 2 was claimed"):
        a.renew()  # the old holder finds the newer generation and stops
    with pytest.raises(LeaseLostError):
        a.check()


def test_renewals_extend_the_claim_and_release_frees_it(tmp_path):
    clock = Clock()
    storage = Storage(str(tmp_path))
    a = Lease(storage, "run", ttl_s=10, clock=clock).acquire()
    for _ in range(5):
        clock.t += 8
        a.renew()  # 40 s after the claim, still valid thanks to the renewals
    b = Lease(storage, "run", ttl_s=10, clock=clock)
    with pytest.raises(RunLockedError):
        b.acquire()
    a.release()
    assert b.acquire().generation == 2  # free at once, no expiry to wait for


def test_reentrant_and_a_child_joins_the_parents_claim(tmp_path):
    storage = Storage(str(tmp_path))
    parent = Lease(storage, "run", ttl_s=30).acquire()
    parent.acquire()
    parent.release()
    assert parent.held
    child = Lease(storage, "run", ttl_s=30).join(parent.token, parent.generation)
    child.renew()
    child.release()  # a joined claim is the parent's: still held
    assert Lease(storage, "run", ttl_s=30).view().owner == parent.token
    with pytest.raises(LeaseLostError):
        Lease(storage, "run", ttl_s=30).join(parent.token, parent.generation + 1)
    parent.release()
    with pytest.raises(LeaseLostError):
        Lease(storage, "run", ttl_s=30).join(parent.token, parent.generation)


def test_a_holder_cut_off_from_the_store_stops_by_itself(tmp_path):
    storage = Storage(str(tmp_path))
    a = Lease(storage, "run", ttl_s=0.3).acquire()
    a.check()
    time.sleep(0.4)  # no renewal for a whole ttl: contenders may take over now
    with pytest.raises(LeaseLostError, match="not renewed"):
        a.check()


@pytest.mark.parametrize("content", [b"", b"{", b"[]"])
def test_an_empty_or_partial_claim_is_stale(tmp_path, content):
    storage = Storage(str(tmp_path))
    storage.write_bytes("leases/run/0000000003.json", content)
    lease = Lease(storage, "run", ttl_s=30).acquire()
    assert lease.generation == 4


CONTENDER = """
import sys, time
from nip_core.runs.storage import Storage
from nip_core.runs.lease import Lease
from nip_core.errors import RunLockedError
start = float(sys.argv[2])
while time.time() < start:
    time.sleep(0.001)
try:
    lease = Lease(Storage(sys.argv[1]), "run", ttl_s=60).acquire()
    print("won", lease.generation, flush=True)
except RunLockedError:
    print("lost", flush=True)
"""


def _race(location: str, n: int, env: dict[str, str] | None = None) -> list[str]:
    start = time.time() + 1.5
    procs = [subprocess.Popen([sys.executable, "-c", CONTENDER, location, str(start)], stdout=subprocess.PIPE,
                              text=True, cwd=REPO, env={**os.environ, **(env or {}), "PYTHONPATH": str(REPO)})
             for _ in range(n)]
    return sorted(p.communicate(timeout=120)[0].strip() for p in procs)


def test_racing_processes_one_wins(tmp_path):
    assert _race(str(tmp_path), 4) == ["lost", "lost", "lost", "won 1"]


@pytest.mark.slow
def test_racing_hosts_on_s3_one_wins_and_takeover_works(s3_endpoint):
    """The same protocol on an object store: the claim is a conditional PUT (If-None-Match)."""
    location = f"s3://{s3_endpoint.bucket}/runs/race"
    assert _race(location, 3, s3_endpoint.env) == ["lost", "lost", "won 1"]
    clock = Clock(time.time() + 120)  # the winner's claim (ttl 60) has expired by then
    storage = Storage(location)
    taker = Lease(storage, "run", ttl_s=60, clock=clock).acquire()
    assert taker.generation == 2
    assert storage.exists("leases/run/0000000002.json")

"""Lease timing: a lost race is retried after a pause within the deadline; renewals keep a margin.

The stores here are real directories; the wrappers only add real delays (``time.sleep``)
or a listing that lags behind the writes, as slow or eventually consistent object stores
have. The lease logic itself is the production code.
"""

from __future__ import annotations

import threading
import time

import pytest

from nip_core.errors import RunLockedError
from nip_core.runs.lease import Lease, LeaseLostError
from nip_core.runs.storage import Storage


class Clock:
    def __init__(self, t: float):
        self.t = t

    def __call__(self) -> float:
        return self.t


class LaggingListing(Storage):
    """A store whose listing of one directory stays as it was (a listing lagging behind writes)."""

    def __init__(self, root, rel: str, names: list[str]):
        super().__init__(root)
        self.rel, self.names = rel, names
        self.listings = 0
        self.creates = 0

    def listdir(self, rel: str = "", **kwargs) -> list[str]:
        if rel == self.rel:
            self.listings += 1
            return list(self.names)
        return super().listdir(rel, **kwargs)

    def create_exclusive(self, rel: str, data: bytes, **kwargs) -> bool:
        self.creates += 1
        if self.creates > 2000:
            raise RuntimeError("spinning on a lost race")
        return super().create_exclusive(rel, data, **kwargs)


def test_losing_the_race_for_the_next_generation_rereads_after_a_pause_within_the_deadline(tmp_path):
    clock = Clock(1_000_000.0)
    Lease(Storage(tmp_path), "run", ttl_s=10, clock=clock).acquire()  # generation 1
    clock.t += 20  # generation 1 has expired
    winner = Lease(Storage(tmp_path), "run", ttl_s=10, clock=clock).acquire()
    assert winner.generation == 2
    # The loser still lists generation 1 only: every claim of generation 2 fails.
    lagging = LaggingListing(tmp_path, "leases/run", ["0000000001.json"])
    loser = Lease(lagging, "run", ttl_s=10, clock=clock)
    outcome: list[object] = []
    started = time.monotonic()
    thread = threading.Thread(target=lambda: outcome.append(_attempt(loser, wait_s=0.6)), daemon=True)
    thread.start()
    thread.join(10)
    took = time.monotonic() - started
    assert not thread.is_alive(), "acquire kept looping past its deadline"
    assert isinstance(outcome[0], RunLockedError), outcome
    assert 0.5 <= took < 3
    assert 2 <= lagging.creates <= 20  # looked again, with pauses between the attempts
    assert lagging.listings >= lagging.creates


def _attempt(lease: Lease, wait_s: float) -> object:
    try:
        return lease.acquire(wait_s=wait_s, poll_s=0.1)
    except Exception as e:  # noqa: BLE001 - the test inspects it
        return e


class SlowRenewals(Storage):
    """A store on which the chosen renewals take ``delay_s`` longer, the claim ``claim_delay_s`` (real sleeps)."""

    def __init__(self, root, delay_s: float, slow: set[int] | None = None, claim_delay_s: float = 0.0):
        super().__init__(root)
        self.delay_s = delay_s
        self.claim_delay_s = claim_delay_s
        self.slow = slow  # which renewals (1, 2, ...) are slow; None: all of them
        self.renewals = 0
        self.landed: list[tuple[int, float]] = []  # (renewal number, monotonic time it landed)

    def create_exclusive(self, rel: str, data: bytes, **kwargs) -> bool:
        time.sleep(self.claim_delay_s)
        return super().create_exclusive(rel, data, **kwargs)

    def write_bytes(self, rel: str, data: bytes, **kwargs) -> None:
        if not rel.endswith(".renew.json"):
            return super().write_bytes(rel, data, **kwargs)
        self.renewals += 1
        number = self.renewals
        if self.slow is None or number in self.slow:
            time.sleep(self.delay_s)
        super().write_bytes(rel, data, **kwargs)
        self.landed.append((number, time.monotonic()))


class TimedContender(Storage):
    """Records when a claim of another generation was first attempted and succeeded."""

    def __init__(self, root):
        super().__init__(root)
        self.took_at: float | None = None

    def create_exclusive(self, rel: str, data: bytes, **kwargs) -> bool:
        started = time.monotonic()
        if super().create_exclusive(rel, data, **kwargs):
            self.took_at = started
            return True
        return False


def _watch(lease: Lease, seconds: float) -> tuple[float | None, str]:
    """Call ``check()`` every 5 ms for ``seconds``; when it first raised and why."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            lease.check()
        except LeaseLostError as e:
            return time.monotonic(), str(e)
        time.sleep(0.005)
    return None, ""


@pytest.mark.slow
def test_a_renewal_slower_than_the_margin_stops_the_holder_before_its_claim_can_be_taken_over(tmp_path):
    ttl = 1.5
    # Renewals take 0.8 ttl, the claim 0.3 ttl: the claim's ttl runs from the start of its request.
    slow = SlowRenewals(tmp_path, delay_s=0.8 * ttl, claim_delay_s=0.3 * ttl)
    holder = Lease(slow, "run", ttl_s=ttl)
    claim_started = time.monotonic()
    holder.acquire()
    holder.keep_alive()
    contender_store = TimedContender(tmp_path)
    contender = Lease(contender_store, "run", ttl_s=ttl)
    thread = threading.Thread(target=lambda: contender.acquire(wait_s=6 * ttl, poll_s=0.01), daemon=True)
    thread.start()
    stopped_at, reason = _watch(holder, 6 * ttl)
    thread.join(6 * ttl)
    holder.stop_renewing()
    assert contender_store.took_at is not None, "the contender never got the lease"
    assert stopped_at is not None, "the holder never stopped"
    assert stopped_at < contender_store.took_at, (stopped_at - claim_started, contender_store.took_at - claim_started)
    assert stopped_at - claim_started < ttl
    assert "claimed by another driver" not in reason  # it stopped by itself, not because it saw the takeover
    # The slow renewal counted as failed: nothing makes the holder valid again.
    with pytest.raises(LeaseLostError):
        holder.check()
    with pytest.raises(LeaseLostError):
        holder.renew()


@pytest.mark.slow
def test_a_healthy_holder_keeps_the_lease_through_a_slow_renewal_within_the_margin(tmp_path):
    ttl = 4.0
    # The second renewal is slow (0.4 s more than a local write): it starts a third of a ttl
    # after the previous one and ends a tenth of a ttl later, 0.9 s before the window (two
    # thirds) closes. That slack is what a loaded CI machine needs: with a ttl of 2 s and a
    # renewal of a fifth of it, 0.27 s were left, and a renewal delayed by the load (thread
    # scheduling, fsync) once ended past the window.
    slow = SlowRenewals(tmp_path, delay_s=0.1 * ttl, slow={2})
    holder = Lease(slow, "run", ttl_s=ttl).acquire()
    holder.keep_alive()
    contender = Lease(Storage(tmp_path), "run", ttl_s=ttl)
    refused: list[object] = []
    thread = threading.Thread(target=lambda: refused.append(_attempt(contender, wait_s=2.5 * ttl)), daemon=True)
    thread.start()
    stopped_at, reason = _watch(holder, 3 * ttl)
    thread.join(2 * ttl)
    assert stopped_at is None, reason
    assert isinstance(refused[0], RunLockedError), refused
    assert slow.renewals >= 7  # renewed every third of the ttl throughout
    assert 2 in dict(slow.landed)
    holder.release()
    assert contender.acquire().generation == 2

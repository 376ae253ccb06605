"""Leases: one holder at a time for a named resource of a run store, on any number of hosts.

A lease is a claim with an expiry. The holder renews it while it works; anyone may take
it over once it has expired, and nobody before. Nothing depends on process ids or host
names, so a holder on another host, in a restarted container (same hostname, pid 1) or
behind a network partition is handled the same way: its claim stands until it expires.

Layout under ``leases/<name>/`` in the run's storage::

    0000000007.json        the claim of generation 7: owner token, holder description,
                           ttl, expiry, epoch (written once, by an exclusive create)
    0000000007.renew.json  the latest renewal of generation 7 (only its owner writes it)

The only conditional operation needed is *create if absent* (``O_EXCL``/``link`` on a
POSIX filesystem, ``If-None-Match: *`` on S3; see :meth:`Storage.create_exclusive`):
to take over, a contender creates generation ``n + 1``; of several contenders exactly one
succeeds. Generations only grow, so they double as fencing tokens: a holder that finds a
newer generation has lost the lease and stops (:class:`LeaseLostError`).

Each claim also carries an *epoch*: the generation of the last takeover, i.e. of the last
claim made over a holder that had not released (a claim after a release keeps the epoch it
finds). Before such a claim the contender runs :meth:`Lease._prepare_takeover` (the run
lease seals the run's mutable files there, :mod:`nip_core.runs.fencing`), so that a holder
paused in the middle of a write can never change what the new holder and readers see.

Expiry is wall-clock time written by the holder: the claim or renewal request's start
plus the ttl. Hosts are assumed to keep their clocks within a small fraction of the ttl
of each other (NTP). The holder keeps a margin of a third of the ttl: a renewal counts
only if it ends within :data:`RENEW_WINDOW` (2/3) of the ttl after the start of the last
successful claim or renewal (each store call is bounded by what is left of that window),
and once that window has passed without one, the holder has lost the lease and stops
(:meth:`Lease.check`), a third of a ttl before anyone may take over. The window is timed
with a clock that keeps counting while the machine sleeps (:func:`elapsed_clock`), so a
holder woken from a suspended laptop or VM finds it has passed. So a contender never
works beside a holder that is cut off from the store or whose store calls are slow. See
``docs/architecture.md`` ("One driver per run").
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nip_core.errors import NipflowError, RunLockedError
from nip_core.runs.storage import Storage

log = logging.getLogger(__name__)

LEASES_DIR = "leases"
DEFAULT_TTL_ENV = "NIPFLOW_LEASE_TTL_S"
_CLAIM = re.compile(r"^(\d{10})\.json$")
KEEP_GENERATIONS = 4
# Renewals count only within this fraction of the ttl after the start of the last
# successful one; the rest of the ttl is the margin for clock skew and slow stores.
RENEW_WINDOW = 2.0 / 3.0
# Pause before looking again after another contender won the race for a generation.
_RACE_PAUSE_S = 0.1


def default_ttl_s() -> float:
    """The lease ttl: ``$NIPFLOW_LEASE_TTL_S`` or 60 s."""
    value = os.environ.get(DEFAULT_TTL_ENV)
    if not value:
        return 60.0
    try:
        ttl = float(value)
    except ValueError:
        raise ValueError(f"{DEFAULT_TTL_ENV}={value!r} is not a number of seconds") from None
    if ttl <= 0:
        raise ValueError(f"{DEFAULT_TTL_ENV} must be positive, got {value}")
    return ttl


def elapsed_clock() -> float:
    """Seconds from a fixed point, counting time the machine spent suspended.

    ``time.monotonic`` stops while a Linux machine sleeps (``CLOCK_MONOTONIC``), so a holder
    whose laptop lid was closed for an hour would wake believing its renewal window still
    open; ``CLOCK_BOOTTIME`` keeps counting (elsewhere ``time.monotonic`` is used).
    """
    return time.clock_gettime(_ELAPSED_CLOCK)


_ELAPSED_CLOCK = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)


class LeaseLostError(NipflowError):
    """This holder's lease was taken over (or could not be renewed in time)."""

    def __init__(self, what: str, reason: str):
        super().__init__(f"lease on {what} lost: {reason}; stopping so that only one driver works on it")


@dataclass
class LeaseView:
    """What the store says about a lease right now."""

    generation: int  # 0: never taken
    owner: str | None
    holder: dict[str, Any]
    expires_at: float  # wall clock; 0 when free
    epoch: int = 0  # the generation of the last takeover (see the module's text)
    released: bool = False  # its holder gave it back (a free lease that was never taken: False)

    def expired(self, now: float) -> bool:
        return self.owner is None or now >= self.expires_at


class Lease:
    """A renewable, expiring claim on ``leases/<name>`` of ``storage``.

    Re-entrant within one object (nested ``acquire``/``release`` pairs). Use
    :meth:`keep_alive` (or the context manager) to renew it from a background thread, and
    :meth:`check` at the points where losing it must stop the work.

    Parameters
    ----------
    storage
        The run's storage (local directory or fsspec URL).
    name
        What the lease protects, e.g. ``"run"`` or a stage key.
    ttl_s
        Seconds a claim or renewal stays valid; renewals happen every ``ttl_s / 3`` and
        must succeed within ``2/3 ttl_s`` of the previous one's start.
    describe
        Extra fields shown to whoever finds the lease held (never used for decisions).
    label
        How errors name what is leased (default: ``name``).
    clock
        Wall-clock source (seconds since the epoch).
    """

    def __init__(self, storage: Storage, name: str, *, ttl_s: float | None = None,
                 describe: dict[str, Any] | None = None, label: str | None = None,
                 clock: Callable[[], float] = time.time):
        self.storage = storage
        self.name = name
        self.label = label or name
        self._joined = False
        self.ttl_s = float(ttl_s if ttl_s is not None else default_ttl_s())
        self.token = uuid.uuid4().hex
        self.describe = {"host": socket.gethostname(), "pid": os.getpid(), **(describe or {})}
        self.clock = clock
        self.generation: int | None = None
        #: The epoch of the held claim (see the module's text); None while not held.
        self.epoch: int | None = None
        self._depth = 0
        self._lost: str | None = None
        self._last_renewed = 0.0  # elapsed_clock() at the START of the last successful claim or renewal
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._mutex = threading.RLock()

    # -- reading the store ----------------------------------------------------------------

    def _dir(self) -> str:
        return f"{LEASES_DIR}/{self.name}"

    def _claim_rel(self, generation: int) -> str:
        return f"{self._dir()}/{generation:010d}.json"

    def _renew_rel(self, generation: int) -> str:
        return f"{self._dir()}/{generation:010d}.renew.json"

    def _generations(self, timeout_s: float | None = None) -> list[int]:
        names = self.storage.listdir(self._dir(), timeout_s=timeout_s)
        return sorted(int(m.group(1)) for n in names if (m := _CLAIM.match(n)))

    def _window_s(self) -> float:
        return RENEW_WINDOW * self.ttl_s

    def _read(self, rel: str) -> dict[str, Any] | None:
        try:
            data = json.loads(self.storage.read_bytes(rel))
        except FileNotFoundError:
            return None
        except (ValueError, UnicodeDecodeError):
            return {}  # empty or torn: carries no valid claim
        return data if isinstance(data, dict) else {}

    def view(self) -> LeaseView:
        """The current generation, its owner and expiry (an unreadable claim counts as expired)."""
        generations = self._generations()
        if not generations:
            return LeaseView(0, None, {}, 0.0)
        generation = generations[-1]
        claim = self._read(self._claim_rel(generation)) or {}
        owner = claim.get("owner")
        if not owner:
            return LeaseView(generation, None, {"note": "unreadable claim"}, 0.0)
        expires = float(claim.get("expires_at", 0.0))
        epoch = int(claim.get("epoch", 0))  # claims made before epochs existed: 0
        renewal = self._read(self._renew_rel(generation)) or {}
        if renewal.get("owner") == owner:
            if renewal.get("released"):
                return LeaseView(generation, None, claim.get("holder", {}), 0.0, epoch, released=True)
            expires = max(expires, float(renewal.get("expires_at", 0.0)))
        return LeaseView(generation, owner, claim.get("holder", {}), expires, epoch)

    # -- taking and giving back ----------------------------------------------------------

    def acquire(self, wait_s: float = 0.0, poll_s: float = 0.25) -> "Lease":
        """Take the lease, waiting up to ``wait_s`` for the holder's claim to expire.

        Raises
        ------
        RunLockedError
            If another owner still holds an unexpired claim after ``wait_s``.
        """
        with self._mutex:
            if self._depth:
                self.check()
                self._depth += 1
                return self
        deadline = time.monotonic() + wait_s
        while True:
            current = self.view()
            now = self.clock()
            if current.owner == self.token and not current.expired(now):
                # Our own claim (one whose request timed out but landed): usable while its
                # renewal window lasts, counted back from the expiry it carries.
                started = elapsed_clock() - max(0.0, self.ttl_s - (current.expires_at - now))
                if elapsed_clock() - started < self._window_s():
                    self._took(current.generation, started, current.epoch)
                    return self
            elif current.expired(now):
                # Over a holder that did not give the lease back (or an unreadable claim): a
                # takeover, which starts a new epoch once the mutable files are sealed.
                takeover = current.generation > 0 and not current.released
                epoch = current.generation + 1 if takeover else current.epoch
                if takeover:
                    self._prepare_takeover(epoch)
                if self._try_claim(current.generation + 1, epoch):
                    if current.owner is not None:
                        log.warning("lease %s: took over generation %d of %s (expired %.1f s ago)", self.name,
                                    current.generation, _describe(current.holder), now - current.expires_at)
                    return self
                # Another contender won this generation (or the claim's outcome is unknown):
                # look again after a short pause, within the deadline.
                if time.monotonic() >= deadline:
                    raise RunLockedError(self.label, {"generation": current.generation + 1,
                                                      "note": "claimed by another driver meanwhile"},
                                         self.storage.full(self._claim_rel(current.generation + 1)))
                time.sleep(min(poll_s, _RACE_PAUSE_S))
                continue
            if time.monotonic() >= deadline:
                raise RunLockedError(self.label, {**current.holder, "generation": current.generation,
                                                 "expires_in_s": round(current.expires_at - now, 1)},
                                     self.storage.full(self._claim_rel(current.generation)))
            time.sleep(min(poll_s, max(0.01, current.expires_at - now)))

    def _prepare_takeover(self, epoch: int) -> None:
        """Run before claiming generation ``epoch`` over a holder that did not release (no-op here)."""

    def _try_claim(self, generation: int, epoch: int = 0) -> bool:
        """Create the claim of ``generation``; whether it is ours now and usable."""
        started = elapsed_clock()
        now = self.clock()
        claim = {"owner": self.token, "holder": {**self.describe, "since": now}, "ttl_s": self.ttl_s,
                 "expires_at": now + self.ttl_s, "generation": generation, "epoch": epoch}
        try:
            created = self.storage.create_exclusive(self._claim_rel(generation), json.dumps(claim).encode(),
                                                    timeout_s=self._window_s())
        except TimeoutError:
            log.warning("lease %s: the claim of generation %d got no answer within %.1f s; looking again",
                        self.name, generation, self._window_s())
            return False
        if not created:
            return False
        if elapsed_clock() - started >= self._window_s():
            # It landed too late to work under: it lapses, and the next look claims anew.
            log.warning("lease %s: the claim of generation %d took %.1f s, past its renewal window",
                        self.name, generation, elapsed_clock() - started)
            return False
        self._took(generation, started, epoch)
        self._prune(generation)
        return True

    def _took(self, generation: int, started: float, epoch: int) -> None:
        with self._mutex:
            self.generation = generation
            self.epoch = epoch
            self._depth = 1
            self._lost = None
            self._last_renewed = started

    def _prune(self, generation: int) -> None:
        for old in self._generations():
            if old <= generation - KEEP_GENERATIONS:
                self.storage.remove(self._renew_rel(old))
                self.storage.remove(self._claim_rel(old))

    def join(self, owner: str, generation: int) -> "Lease":
        """Work under a lease another process holds (a parent flow run's), renewing it too.

        Raises :class:`LeaseLostError` if that claim is no longer the current, unexpired one.
        """
        current = self.view()
        now = self.clock()
        if current.generation == generation and current.owner == owner and current.expired(now):
            raise LeaseLostError(self.label, f"generation {generation} expired {now - current.expires_at:.1f} s ago "
                                            f"(its holder, {_describe(current.holder)}, stopped renewing it)")
        if current.generation != generation or current.owner != owner:
            raise LeaseLostError(self.label, f"generation {generation} is not the current claim "
                                            f"(now generation {current.generation} of {_describe(current.holder)})")
        # The claim's last renewal started one ttl before the expiry it carries.
        started = elapsed_clock() - max(0.0, self.ttl_s - (current.expires_at - now))
        if elapsed_clock() - started >= self._window_s():
            raise LeaseLostError(self.label, f"generation {generation} expires in "
                                            f"{current.expires_at - now:.1f} s, too soon to join it")
        self.token = owner
        self._joined = True
        self._took(generation, started, current.epoch)
        return self

    def release(self) -> None:
        """Give the lease back (the outermost release of a re-entrant holder)."""
        with self._mutex:
            if not self._depth:
                return
            self._depth -= 1
            if self._depth:
                return
        self.stop_renewing()
        with self._mutex:
            generation, self.generation = self.generation, None
            self.epoch = None
            joined, self._joined = self._joined, False
            if joined:
                return  # the claim is the parent's to give back
            if self._lost is None and generation is not None and self.view().generation == generation:
                try:
                    self._write_renewal(generation, released=True, timeout_s=self.ttl_s)
                except TimeoutError:
                    log.warning("lease %s: the store did not answer the release; the claim lapses at its expiry",
                                self.name)

    @property
    def held(self) -> bool:
        return self._depth > 0 and self._lost is None

    # -- renewing and checking -------------------------------------------------------------

    def _write_renewal(self, generation: int, released: bool = False, timeout_s: float | None = None) -> None:
        now = self.clock()
        body = {"owner": self.token, "expires_at": 0.0 if released else now + self.ttl_s, "renewed_at": now,
                "released": released}
        self.storage.write_bytes(self._renew_rel(generation), json.dumps(body).encode(), timeout_s=timeout_s)

    def _lose(self, reason: str) -> LeaseLostError:
        with self._mutex:
            if self._lost is None:
                self._lost = reason
            return LeaseLostError(self.label, self._lost)

    def renew(self) -> None:
        """Extend the claim by a ttl; raise :class:`LeaseLostError` if it was taken over.

        The renewal counts only if it ends within the renewal window (2/3 ttl after the
        start of the last successful one); its store calls are bounded by what is left
        of it. One that fails inside the window may be retried; one that ends past it,
        or starts past it, loses the lease: its claim may lapse before the renewal is
        seen, and a contender may take over.
        """
        with self._mutex:
            if self._lost is not None:
                raise LeaseLostError(self.label, self._lost)
            generation = self.generation
            if generation is None:
                raise LeaseLostError(self.label, "not held")
            started = elapsed_clock()
            window_end = self._last_renewed + self._window_s()
        if started >= window_end:
            raise self._lose(self._not_renewed())
        # The store calls run without the mutex: check() never waits for a slow store.
        newest = self._generations(timeout_s=window_end - elapsed_clock())
        if newest and newest[-1] != generation:
            raise self._lose(f"generation {newest[-1]} was claimed by another driver")
        self._write_renewal(generation, timeout_s=window_end - elapsed_clock())
        finished = elapsed_clock()
        if finished > window_end:
            raise self._lose(f"a renewal took {finished - started:.1f} s and ended past the renewal window "
                             f"({self._window_s():g} s after the last successful one)")
        with self._mutex:
            if self.generation == generation:
                self._last_renewed = max(self._last_renewed, started)

    def _not_renewed(self) -> str:
        return f"not renewed within {self._window_s():g} s (2/3 of its ttl; store unreachable or too slow?)"

    def check(self) -> None:
        """Raise :class:`LeaseLostError` if the lease was lost or its renewal window has passed.

        That is a third of a ttl before the claim may expire: a holder stops before
        anyone may take over, also when its renewals hang.
        """
        with self._mutex:
            if self._lost is not None:
                raise LeaseLostError(self.label, self._lost)
            if self._depth and elapsed_clock() - self._last_renewed >= self._window_s():
                self._lost = self._not_renewed()
                raise LeaseLostError(self.label, self._lost)

    def keep_alive(self) -> None:
        """Renew every ``ttl_s / 3`` (sooner again after a failure) from a daemon thread until released."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._renew_loop, name=f"lease-{self.name}", daemon=True)
        self._thread.start()

    def stop_renewing(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=self.ttl_s)

    def _renew_loop(self) -> None:
        interval = self.ttl_s / 3.0
        retry = self.ttl_s / 12.0
        next_at = self._last_renewed + interval
        while not self._stop.wait(max(0.0, next_at - elapsed_clock())):
            try:
                self.renew()
                next_at = self._last_renewed + interval
            except LeaseLostError as e:
                log.error("%s", e)
                return
            except Exception as e:  # noqa: BLE001 - a store hiccup: retry within the window; check() stops the work
                log.warning("lease %s: renewal failed (%s: %s); retrying", self.name, type(e).__name__, e)
                next_at = elapsed_clock() + retry

    def __enter__(self) -> "Lease":
        self.acquire()
        self.keep_alive()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def _describe(holder: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in holder.items()) or "unknown holder"

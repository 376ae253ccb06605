"""Create remote objects (uploaded files, fine-tune jobs) exactly once per intent.

A ``POST`` whose response is lost (a proxy drops it, a timeout fires after the server
acted) leaves the caller not knowing whether the object exists. The official ``openai``
client retries such requests by itself and sends no idempotency key, so each of its
retries can create one more job (each billed). Here creates are never retried blindly:

1. look the object up by what identifies the intent (a job's ``metadata``, checked
   client-side on every page of the listing; a file's deterministic name);
2. only if it is absent, send the create request once, with the client's own retries
   switched off;
3. after any failure whose outcome is unknown (connection error, timeout, 5xx, 408, 409),
   keep looking the object up for a while before creating it again: a create that timed
   out may still be running on the server, a 502 may hide a server that went on working,
   and a listing may lag a create. The look-ups come 0.25, 0.5, 1, 2, 4... s apart until
   ``settle_s`` has passed (``$NIPFLOW_CREATE_SETTLE_S``, default 30 s); only an object
   still absent then is created again. A 429 says the request was refused (OpenAI acts on
   no rate-limited request): one look-up after the wait it asks for, then a new create.

Errors that say the request was refused (other 4xx) are raised at once.

Fine-tune jobs of one intent found more than once (created before this rule, or by a
server that acted on a request twice) follow one rule everywhere (:func:`adopt`): the
highest ``nipflow_attempt`` wins and, within it, the oldest job; the others are cancelled
and their ids returned, so that the caller records them.
See ``docs/behaviour.md`` ("Exactly-once remote creation").
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

import openai

from nip_core.errors import NipflowError

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Status codes after which the request may or may not have been acted on (429 is retried
#: too, but as a refusal: see the module docstring).
UNKNOWN_OUTCOME_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})
SETTLE_ENV = "NIPFLOW_CREATE_SETTLE_S"
DEFAULT_SETTLE_S = 30.0
#: statuses of a job that can still be cancelled
_CANCELLABLE = frozenset({"validating_files", "queued", "running", "paused"})


def settle_seconds() -> float:
    """How long a create with an unknown outcome is looked up before it is sent again.

    Raises
    ------
    ValueError
        ``$NIPFLOW_CREATE_SETTLE_S`` is not a number of seconds >= 0 (named in the message).
    """
    raw = os.environ.get(SETTLE_ENV)
    if raw is None or raw == "":
        return DEFAULT_SETTLE_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"${SETTLE_ENV}={raw!r}: must be a number of seconds >= 0")
    return value


class RemoteCreateError(NipflowError):
    """A create request kept failing with an unknown outcome (names the object and the last error)."""

    def __init__(self, what: str, tries: int, last: BaseException | None):
        super().__init__(f"could not create {what} after {tries} tries (each preceded by a look-up); "
                         f"last error: {type(last).__name__}: {last}")
        self.what = what
        self.last = last


def outcome_unknown(error: BaseException) -> bool:
    """Whether ``error`` leaves open whether the server acted on the request."""
    if isinstance(error, openai.APIConnectionError):  # also APITimeoutError
        return True
    if isinstance(error, openai.APIStatusError):
        return error.status_code in UNKNOWN_OUTCOME_STATUS or error.status_code >= 500
    return False


def create_exactly_once(what: str, lookup: Callable[[], T | None], create: Callable[[], T], *,
                        max_tries: int = 8, backoff_s: float = 0.25, max_backoff_s: float = 8.0,
                        settle_s: float | None = None,
                        sleep: Callable[[float], None] = time.sleep) -> tuple[T, bool]:
    """``(object, created)``: the object found by ``lookup``, else the one ``create`` made.

    ``create`` must not retry by itself (use :func:`no_retry`). ``lookup`` is called
    before every create attempt, and repeatedly for ``settle_s`` seconds (default
    :func:`settle_seconds`) after a create whose outcome is unknown, so a create whose
    response was lost, or that the server carries out late, is found there.

    Raises
    ------
    RemoteCreateError
        If every try failed with an unknown outcome and no look-up found the object.
    openai.APIStatusError
        If the server refused the request (a 4xx other than 408/409/429).
    """
    settle_s = settle_seconds() if settle_s is None else settle_s
    last: BaseException | None = None
    for attempt in range(max_tries):
        found = lookup()
        if found is not None:
            if attempt:
                log.info("%s: found after %d failed create request(s); not creating again", what, attempt)
            return found, False
        try:
            return create(), True
        except (openai.APIConnectionError, openai.APIStatusError) as e:
            if not outcome_unknown(e):
                raise
            last = e
            wait = min(max_backoff_s, backoff_s * 2 ** attempt)
            retry_after = _retry_after(e)
            if retry_after is not None:
                wait = max(wait, min(retry_after, 60.0))
            if getattr(e, "status_code", None) == 429:  # refused, not acted on
                log.warning("%s: create request rate-limited; trying again in %.2f s", what, wait)
                sleep(wait)
                continue
            log.warning("%s: create request failed (%s: %s); looking it up for up to %.0f s before creating "
                        "it again", what, type(e).__name__, e, max(settle_s, wait))
            found = _settle(lookup, max(settle_s, wait), backoff_s, sleep)
            if found is not None:
                log.info("%s: found after the failed create request; not creating again", what)
                return found, False
    found = lookup()
    if found is not None:
        return found, False
    raise RemoteCreateError(what, max_tries, last)


def _settle(lookup: Callable[[], T | None], settle_s: float, first_s: float,
            sleep: Callable[[float], None]) -> T | None:
    """Look up at ``first_s``, then doubling intervals, until ``settle_s`` has passed."""
    waited, interval = 0.0, max(first_s, 0.05)
    while waited < settle_s:
        step = min(interval, settle_s - waited)
        sleep(step)
        waited += step
        found = lookup()
        if found is not None:
            return found
        interval *= 2
    return None


def _retry_after(error: BaseException) -> float | None:
    response = getattr(error, "response", None)
    if response is None:
        return None
    value = response.headers.get("retry-after")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def no_retry(client: Any) -> Any:
    """The same client with its automatic retries off (for non-idempotent requests)."""
    return client.with_options(max_retries=0)


# -- fine-tune jobs ------------------------------------------------------------------------

def find_jobs(client: Any, metadata: dict[str, str], page_size: int = 100) -> list[Any]:
    """Every job whose metadata contains all of ``metadata``, over all pages, oldest first
    (by ``created_at``, which counts whole seconds; jobs of the same second in the reverse of
    the listing's newest-first order).

    The server's metadata filter is only a hint: each job is checked here as well (a
    server that ignores the filter, or matches loosely, must not make us adopt a job
    of another run).
    """
    found = []
    for job in client.fine_tuning.jobs.list(metadata=metadata, limit=page_size):  # auto-paging
        have = job.metadata or {}
        if all(have.get(k) == v for k, v in metadata.items()):
            found.append(job)
    return sorted(reversed(found), key=lambda j: j.created_at)


def _attempt(job: Any) -> int:
    try:
        return int((job.metadata or {}).get("nipflow_attempt", "1"))
    except ValueError:
        return 1


def adopt(client: Any, jobs: list[Any]) -> tuple[Any, list[str]]:
    """The job to use among ``jobs`` of one intent, and the ids of the duplicates it handled.

    One rule everywhere: the highest ``nipflow_attempt``, then the oldest (``jobs`` in
    :func:`find_jobs`'s order). Jobs of that attempt other than the chosen one are duplicates: each one that
    can still run is cancelled (a failed cancel is logged: the next look-up tries again).
    The ids returned are those of the duplicates not already cancelled before this call
    (one that had already finished is listed too: it was billed). Earlier attempts ended
    before a later one was created and are left alone.
    """
    top = max(_attempt(j) for j in jobs)
    same = [j for j in jobs if _attempt(j) == top]  # find_jobs's order: oldest first
    chosen, handled = same[0], []
    for job in same[1:]:
        if job.status == "cancelled":
            continue
        handled.append(job.id)
        log.warning("job %s (%s) duplicates %s (metadata %s)%s", job.id, job.status, chosen.id, chosen.metadata,
                    "; cancelling it" if job.status in _CANCELLABLE else "")
        if job.status in _CANCELLABLE:
            try:
                client.fine_tuning.jobs.cancel(job.id)
            except openai.APIError as e:
                log.warning("could not cancel duplicate job %s: %s", job.id, e)
    return chosen, handled


def create_job_once(client: Any, metadata: dict[str, str], **create_args: Any) -> tuple[Any, bool, list[str]]:
    """Adopt the job carrying exactly ``metadata``, or create it once: ``(job, created,
    cancelled)``, ``cancelled`` the ids of duplicates found and cancelled (:func:`adopt`)."""
    cancelled: list[str] = []

    def lookup() -> Any:
        jobs = find_jobs(client, metadata)
        if not jobs:
            return None
        job, extra = adopt(client, jobs)
        cancelled.extend(i for i in extra if i not in cancelled)
        return job

    job, created = create_exactly_once(
        f"fine-tune job {metadata}", lookup,
        lambda: no_retry(client).fine_tuning.jobs.create(metadata=metadata, **create_args))
    return job, created, cancelled


# -- files ---------------------------------------------------------------------------------

def jsonl_bytes(rows: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows).encode()


def content_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def find_file(client: Any, filename: str, purpose: str) -> Any | None:
    """The newest usable file named ``filename`` with ``purpose`` (all pages), or None."""
    for f in client.files.list(purpose=purpose):  # auto-paging, newest first
        if f.filename == filename and getattr(f, "status", None) not in ("error", "deleted"):
            return f
    return None


def upload_file_once(client: Any, filename: str, data: bytes, purpose: str = "fine-tune") -> tuple[Any, bool]:
    """Reuse the file called ``filename`` or upload ``data`` under that name once.

    The name must identify the content (callers put a content hash in it), so that a
    file found by name is the file that would have been uploaded.
    """
    return create_exactly_once(
        f"file {filename}", lambda: find_file(client, filename, purpose),
        lambda: no_retry(client).files.create(file=(filename, io.BytesIO(data)), purpose=purpose))

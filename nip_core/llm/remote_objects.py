"""Create remote objects (uploaded files, fine-tune jobs) exactly once per intent.

A ``POST`` whose response is lost (a proxy drops it, a timeout fires after the server
acted) leaves the caller not knowing whether the object exists. The official ``openai``
client retries such requests by itself and sends no idempotency key, so each of its
retries can create one more job (each billed). Here creates are never retried blindly:

1. look the object up by what identifies the intent (a job's ``metadata``, checked
   client-side on every page of the listing; a file's deterministic name);
2. only if it is absent, send the create request once, with the client's own retries
   switched off;
3. after any failure whose outcome is unknown (connection error, timeout, 5xx, 408, 409,
   429), go back to 1.

Errors that say the request was refused (other 4xx) are raised at once.
See ``docs/behaviour.md`` ("Exactly-once remote creation").
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

import openai

from nip_core.errors import NipflowError

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Status codes after which the request may or may not have been acted on.
UNKNOWN_OUTCOME_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})


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
                        sleep: Callable[[float], None] = time.sleep) -> tuple[T, bool]:
    """``(object, created)``: the object found by ``lookup``, else the one ``create`` made.

    ``create`` must not retry by itself (use :func:`no_retry`). ``lookup`` is called
    before every create attempt, so a create whose response was lost is found there.

    Raises
    ------
    RemoteCreateError
        If every try failed with an unknown outcome and no look-up found the object.
    openai.APIStatusError
        If the server refused the request (a 4xx other than 408/409/429).
    """
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
            log.warning("%s: create request failed (%s: %s); looking it up again in %.2f s",
                        what, type(e).__name__, e, wait)
            sleep(wait)
    found = lookup()
    if found is not None:
        return found, False
    raise RemoteCreateError(what, max_tries, last)


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
    """Every job whose metadata contains all of ``metadata``, over all pages, oldest first.

    The server's metadata filter is only a hint: each job is checked here as well (a
    server that ignores the filter, or matches loosely, must not make us adopt a job
    of another run).
    """
    found = []
    for job in client.fine_tuning.jobs.list(metadata=metadata, limit=page_size):  # auto-paging
        have = job.metadata or {}
        if all(have.get(k) == v for k, v in metadata.items()):
            found.append(job)
    return sorted(found, key=lambda j: (j.created_at, j.id))


def create_job_once(client: Any, metadata: dict[str, str], **create_args: Any) -> tuple[Any, bool]:
    """Adopt the job carrying exactly ``metadata``, or create it once; ``(job, created)``."""
    def lookup() -> Any:
        jobs = find_jobs(client, metadata)
        if len(jobs) > 1:
            log.warning("%d jobs carry metadata %s (created before exactly-once creation?); adopting the "
                        "oldest, %s", len(jobs), metadata, jobs[0].id)
        return jobs[0] if jobs else None

    return create_exactly_once(
        f"fine-tune job {metadata}", lookup,
        lambda: no_retry(client).fine_tuning.jobs.create(metadata=metadata, **create_args))


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

"""A run's invocations: every driver records in ``metadata.json`` when it drove the run and how that ended.

A driver (``nipflow run --direct``, a ``train_experiment`` flow run) records one
invocation with :func:`begin_invocation` when it starts driving the run and
:func:`end_invocation` when it stops, with how it ended (:data:`STATUSES`, from
:func:`outcome_of` the error it ended with). :mod:`nip_core.runs.driving` does both for every
driver; the result card (:mod:`nip_core.logging.result_card`) reports the latest
invocation's wall time and the sum over all finished ones.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from nip_core.errors import TrainingPreempted

INVOCATIONS_KEY = "invocations"
# How a driver's work on a run ended (``end_invocation``'s ``status``).
STATUSES = ("completed", "failed", "preempted", "interrupted", "suspended")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


def begin_invocation(run: Any, driver: str, *, flow_run_id: str | None = None,
                     prefect_ui: str | None = None) -> int:
    """Record in ``metadata.json`` that a driver starts working on ``run``; return its index.

    Parameters
    ----------
    run
        The opened run (:class:`nip_core.runs.Run`); the caller holds its lease.
    driver
        ``"direct"`` (``nipflow run --direct``) or ``"flow"`` (a ``train_experiment`` flow run).
    flow_run_id, prefect_ui
        The Prefect flow run, and how to see it (a URL, or the ``nipflow ui`` command), if any.
    """
    meta = run.metadata() if run.exists("metadata.json") else {}
    invocations = list(meta.get(INVOCATIONS_KEY) or [])
    record: dict[str, Any] = {"started": _now(), "driver": driver}
    if flow_run_id:
        record["flow_run_id"] = str(flow_run_id)
    if prefect_ui:
        record["prefect_ui"] = prefect_ui
    invocations.append(record)
    run.update_metadata(**{INVOCATIONS_KEY: invocations})
    return len(invocations) - 1


def end_invocation(run: Any, index: int, status: str, message: str | None = None) -> None:
    """Record the end of invocation ``index`` of ``run`` and how it ended.

    Raises
    ------
    ValueError
        If ``status`` is not one of :data:`STATUSES`, or ``index`` names no invocation.
    """
    if status not in STATUSES:
        raise ValueError(f"status: expected one of {', '.join(STATUSES)}, got {status!r}")
    meta = run.metadata()
    invocations = list(meta.get(INVOCATIONS_KEY) or [])
    if not 0 <= index < len(invocations):
        raise ValueError(f"index: run {run.run_id} has {len(invocations)} invocation(s), got {index}")
    invocations[index] = {**invocations[index], "ended": _now(), "status": status,
                          **({"message": message[:500]} if message else {})}
    run.update_metadata(**{INVOCATIONS_KEY: invocations})


def outcome_of(error: BaseException) -> tuple[str, str | None]:
    """``(status, message)`` of an invocation that ended with ``error``."""
    if isinstance(error, TrainingPreempted):
        return "preempted", str(error)
    if isinstance(error, KeyboardInterrupt):  # Ctrl-C, or SIGTERM/SIGHUP handled like it ("stopped by SIGTERM")
        return "interrupted", str(error) or None
    return "failed", f"{type(error).__name__}: {error}"


def latest_invocation(run: Any) -> dict[str, Any]:
    """The latest invocation record of ``run`` (empty without one)."""
    if not run.exists("metadata.json"):
        return {}
    invocations = run.metadata().get(INVOCATIONS_KEY) or []
    return dict(invocations[-1]) if invocations else {}


def invocation_count(run: Any) -> int:
    """How many invocations ``run`` has recorded (0 for a run without metadata)."""
    if not run.exists("metadata.json"):
        return 0
    return len(run.metadata().get(INVOCATIONS_KEY) or [])

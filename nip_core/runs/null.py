"""``NullRun``: the run of a trainer that persists nothing (no run store, or ``test_run``).

It answers the :class:`~nip_core.runs.store.Run` interface the trainers use so that they
call the run unconditionally instead of guarding every call with ``run is None``:

* writes (state, JSON files, checkpoints, metrics, metadata) are dropped;
* questions about stored things answer "nothing stored": :meth:`NullRun.has_state` and
  :meth:`NullRun.exists` are false, :meth:`NullRun.list_checkpoints` and
  :meth:`NullRun.read_metrics` empty;
* reads of a stored thing raise :class:`~nip_core.errors.CheckpointNotFoundError` naming
  the file under ``(no run store)/``, as a real run does for a missing file.

Code that must do something else without a run store (skip serialising a checkpoint that
would be dropped, take no lease) asks :attr:`NullRun.persistent` (``Run.persistent`` is
true). A ``NullRun`` has no storage and no lock.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel

from nip_core.errors import CheckpointNotFoundError

StateT = TypeVar("StateT", bound=BaseModel)

NO_STORE = "(no run store)"


class NullRun:
    """A run that stores nothing; see the module docs.

    Parameters
    ----------
    run_id
        The id the trainer reports (the settings' ``run_id``, or ``"NO_RUN_ID"``).
    params
        The trainer's hyper-parameters (``params_hash`` is theirs), if known.
    """

    persistent = False
    incarnation = "none"  # remote objects of a throw-away run are not tied to any run store entry
    location = "<no run>"  # as the trainers' messages wrote it before NullRun

    def __init__(self, run_id: str | None = None, params: Any = None):
        self.run_id = run_id or "NO_RUN_ID"
        self.params = params
        self.params_hash = params.params_hash() if params is not None else None

    def __repr__(self) -> str:
        return f"NullRun({self.run_id!r})"

    def _missing(self, rel: str, what: str) -> CheckpointNotFoundError:
        return CheckpointNotFoundError(f"{NO_STORE}/{rel}", what)

    # -- files ---------------------------------------------------------------------------

    def write_json(self, rel: str, obj: Any) -> None:
        """Dropped."""

    def write_json_once(self, rel: str, obj: Any, what: str = "file") -> bool:
        """Dropped (nothing was created)."""
        return False

    def read_json(self, rel: str, what: str = "file") -> Any:
        """Raises ``CheckpointNotFoundError``: nothing is stored."""
        raise self._missing(rel, what)

    def exists(self, rel: str) -> bool:
        return False

    # -- state ---------------------------------------------------------------------------

    def check_lease(self) -> None:
        """Nothing to check: a throw-away run has no lease."""

    def save_state(self, state: BaseModel) -> None:
        """Dropped."""

    def has_state(self) -> bool:
        return False

    def load_state(self, cls: type[StateT]) -> StateT:
        """Raises ``CheckpointNotFoundError`` (callers then start from a fresh state)."""
        raise self._missing("state.json", "state file")

    # -- metadata, checkpoints, metrics --------------------------------------------------

    def metadata(self) -> dict[str, Any]:
        return {}

    def update_metadata(self, **fields: Any) -> dict[str, Any]:
        """Dropped; returns ``fields`` (the metadata as it would read)."""
        return dict(fields)

    def save_checkpoint_bytes(self, name: str, data: bytes, **info: Any) -> str:
        """Dropped; the path the data would have had."""
        return f"checkpoints/{name}.pt"

    def load_checkpoint_bytes(self, name: str) -> tuple[bytes, dict[str, Any]]:
        raise self._missing(f"checkpoints/{name}.json", "checkpoint manifest")

    def list_checkpoints(self) -> list[str]:
        return []

    def read_metrics(self) -> list[dict[str, Any]]:
        return []

    def append_metrics(self, iteration: int, metrics: dict[str, Any], key: str = "iteration") -> bool:
        """Dropped; returns False (no line written)."""
        return False

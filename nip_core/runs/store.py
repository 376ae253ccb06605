"""The run store: one directory per ``run_id`` holding everything about a run.

Layout (relative to ``<runs_dir>/<run_id>/``)::

    hyper_params.json   the HyperParameters (canonical JSON)
    metadata.json       package version, params hash, created/updated, W&B run id ...
    state.json          the trainer state (written atomically after every stage)
    leases/run/         the lease of the driver working on the run (nip_core.runs.lease)
    leases/metadata.lock  the lock of metadata.json updates (an empty file; local stores only)
    checkpoints/        model/optimiser checkpoints (+ a .json manifest with a sha256 each)
    rollouts/           sampled rollouts, one file per iteration
    transcripts/        human-readable transcripts
    fine_tune/          one record per (iteration, group) fine-tune job
    metrics.jsonl       one line per iteration (append-only, never duplicated)
    results/            Prefect result storage of this run's tasks
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import uuid
from datetime import datetime, timezone
from importlib import metadata as importlib_metadata
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from nip_core.errors import (
    CheckpointNotFoundError,
    CorruptCheckpointError,
    InvalidRunIdError,
    ParamsMismatchError,
    RunNotFoundError,
    WriteOnceConflictError,
)
from nip_core.parameters import HyperParameters, diff_params
from nip_core.runs.lock import RunLock
from nip_core.runs.storage import Storage
from nip_core.settings import ParamsMismatchPolicy

log = logging.getLogger(__name__)
StateT = TypeVar("StateT", bound=BaseModel)

RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")
PARAMS_FILE = "hyper_params.json"
METADATA_FILE = "metadata.json"
STATE_FILE = "state.json"
METRICS_FILE = "metrics.jsonl"
METADATA_LOCK = "leases/metadata.lock"


def package_version() -> str:
    try:
        return importlib_metadata.version("nipflow")
    except importlib_metadata.PackageNotFoundError:
        return "0.0.0+source"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


def new_incarnation() -> str:
    return uuid.uuid4().hex[:12]


def validate_run_id(run_id: str) -> str:
    if not RUN_ID_PATTERN.match(run_id or ""):
        raise InvalidRunIdError(run_id)
    return run_id


def json_record_bytes(obj: Any) -> bytes:
    """The bytes of a JSON record of the run store (pydantic models as their JSON dump)."""
    if isinstance(obj, BaseModel):
        obj = obj.model_dump(mode="json")
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()


class Run:
    """An opened run directory. Obtain one with :meth:`RunStore.open_run`.

    Its stand-in for a trainer that persists nothing is :class:`nip_core.runs.null.NullRun`.
    """

    #: Whether what is written to this run is kept (``NullRun``: false).
    persistent = True

    def __init__(self, storage: Storage, run_id: str, params: HyperParameters):
        self.storage = storage
        self.run_id = run_id
        self.params = params
        self.params_hash = params.params_hash()
        self.lock = RunLock(storage, run_id)
        self._incarnation: str | None = None

    @property
    def location(self) -> str:
        return self.storage.url()

    @property
    def incarnation(self) -> str:
        """A random id given to this run store entry when it was created.

        It goes into every remote object's identity (job metadata, file names), so a run
        id that is deleted and created again never adopts the old entry's jobs or models.
        Entries made before incarnations existed get one on first use.
        """
        if self._incarnation is None:
            meta = self._modify_metadata(lambda m: None if m.get("incarnation") else {"incarnation": new_incarnation()})
            self._incarnation = str(meta["incarnation"])
        return self._incarnation

    # -- JSON ------------------------------------------------------------------------------

    def write_json(self, rel: str, obj: Any) -> None:
        self.storage.write_bytes(rel, json_record_bytes(obj))

    def write_once(self, rel: str, data: bytes, what: str = "file") -> bool:
        """Create ``rel`` with ``data``; never replace it. Returns whether this call created it.

        For files that are written once and then read as they are (rollouts, transcripts,
        the models of an iteration). The create is exclusive (:meth:`Storage.create_exclusive`),
        so two drivers of the run — one paused at any instruction before this call and woken
        after another took the run over — cannot both put their bytes there: the second one
        finds the file. The same bytes again are a no-op (a repeated write); other bytes are
        refused: ``LeaseLostError`` when this driver has lost its lease, else
        ``WriteOnceConflictError``; either way the file keeps what the first writer wrote.
        """
        if self.storage.create_exclusive(rel, data):
            return True
        if self.storage.read_bytes(rel) == data:
            return False
        self.check_lease()
        raise WriteOnceConflictError(self.storage.url(rel), what)

    def write_json_once(self, rel: str, obj: Any, what: str = "file") -> bool:
        """:meth:`write_once` of ``obj`` as :meth:`write_json` writes it."""
        return self.write_once(rel, json_record_bytes(obj), what)

    def read_json(self, rel: str, what: str = "file") -> Any:
        try:
            raw = self.storage.read_bytes(rel)
        except FileNotFoundError:
            raise CheckpointNotFoundError(self.storage.full(rel), what) from None
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise CorruptCheckpointError(self.storage.full(rel), f"invalid JSON ({e})") from None

    def exists(self, rel: str) -> bool:
        return self.storage.exists(rel)

    # -- state -----------------------------------------------------------------------------

    def check_lease(self) -> None:
        """Raise ``LeaseLostError`` if this process drives the run and lost its lease.

        Called before every write that moves the run forward (state, checkpoints, remote
        jobs), so a driver that was taken over stops before it can overwrite anything.
        A run opened without taking the lease (read-only tools, unit tests) is not checked.
        """
        if self.lock.generation is not None:
            self.lock.check()

    def save_state(self, state: BaseModel) -> None:
        """Atomically write ``state.json`` and bump ``metadata.updated``."""
        self.check_lease()
        self.write_json(STATE_FILE, state)
        self.update_metadata(updated=_now())

    def has_state(self) -> bool:
        return self.storage.exists(STATE_FILE)

    def load_state(self, cls: type[StateT]) -> StateT:
        """Read ``state.json`` into ``cls``.

        Raises
        ------
        CheckpointNotFoundError
            If there is no state file.
        CorruptCheckpointError
            If it is not valid JSON or does not fit ``cls``.
        """
        data = self.read_json(STATE_FILE, "state file")
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            first = e.errors(include_url=False)[0]
            where = ".".join(str(x) for x in first["loc"])
            raise CorruptCheckpointError(self.storage.full(STATE_FILE),
                                         f"does not match {cls.__name__}: {where}: {first['msg']}") from None

    # -- metadata --------------------------------------------------------------------------

    def metadata(self) -> dict[str, Any]:
        return self.read_json(METADATA_FILE, "run metadata")

    def update_metadata(self, **fields: Any) -> dict[str, Any]:
        """Set ``fields`` in ``metadata.json`` (a locked read-modify-write); the new metadata.

        Updates of one run's metadata are serialised within this process and, on a local
        or NFS run store, across processes (:meth:`Storage.locked`), so none is lost. On an
        object store only the first holds: there the run lease keeps other drivers out,
        and a tool that updates the metadata of a run someone else drives may lose an
        update to it or make it lose one (last writer wins).
        """
        return self._modify_metadata(lambda meta: fields)

    def _modify_metadata(self, change: Callable[[dict[str, Any]], dict[str, Any] | None]) -> dict[str, Any]:
        """Apply ``change(meta)`` (fields to set, or None for none) under the metadata lock."""
        with self.storage.locked(METADATA_LOCK):
            try:
                meta = json.loads(self.storage.read_bytes(METADATA_FILE))
            except FileNotFoundError:
                meta = {}
            except (ValueError, UnicodeDecodeError) as e:
                raise CorruptCheckpointError(self.storage.full(METADATA_FILE), f"invalid JSON ({e})") from None
            fields = change(meta)
            if fields:
                meta.update(fields)
                self.write_json(METADATA_FILE, meta)
            return meta

    # -- binary checkpoints ----------------------------------------------------------------

    def save_checkpoint_bytes(self, name: str, data: bytes, **info: Any) -> None:
        """Write ``checkpoints/<name>.pt`` and its manifest (sha256, params hash, info).

        The data file is written first and the manifest last, so a crash in between
        leaves a manifest that does not match and the checkpoint is refused, not reused.
        """
        self.check_lease()
        sha = hashlib.sha256(data).hexdigest()
        self.storage.write_bytes(f"checkpoints/{name}.pt", data)
        manifest = {"name": name, "sha256": sha, "size": len(data), "params_hash": self.params_hash,
                    "saved_at": _now(), **info}
        self.write_json(f"checkpoints/{name}.json", manifest)

    def load_checkpoint_bytes(self, name: str) -> tuple[bytes, dict[str, Any]]:
        """Read a checkpoint, verifying checksum and params hash."""
        manifest_rel = f"checkpoints/{name}.json"
        data_rel = f"checkpoints/{name}.pt"
        manifest = self.read_json(manifest_rel, "checkpoint manifest")
        try:
            data = self.storage.read_bytes(data_rel)
        except FileNotFoundError:
            raise CheckpointNotFoundError(self.storage.full(data_rel)) from None
        if hashlib.sha256(data).hexdigest() != manifest.get("sha256"):
            raise CorruptCheckpointError(self.storage.full(data_rel),
                                         "sha256 does not match its manifest")
        if manifest.get("params_hash") != self.params_hash:
            raise CorruptCheckpointError(
                self.storage.full(data_rel),
                f"written for params hash {manifest.get('params_hash')}, run has {self.params_hash}",
            )
        return data, manifest

    def list_checkpoints(self) -> list[str]:
        return [n[:-5] for n in self.storage.listdir("checkpoints") if n.endswith(".json")]

    # -- metrics ---------------------------------------------------------------------------

    def read_metrics(self) -> list[dict[str, Any]]:
        """The committed rows of ``metrics.jsonl``, in file order.

        A row is committed once its newline is written: a last line without one is the
        torn remains of an interrupted append and is ignored (even if it happens to
        parse), consistently with :meth:`Storage.append_line`, which cuts it off before
        the next append. Unparseable lines elsewhere are skipped with a warning.
        """
        if not self.storage.exists(METRICS_FILE):
            return []
        data = self.storage.read_bytes(METRICS_FILE)
        if data and not data.endswith(b"\n"):
            log.warning("%s: ignoring a torn last line (no newline; an interrupted append)",
                        self.storage.url(METRICS_FILE))
            data = data[:data.rfind(b"\n") + 1]
        rows = []
        for line in data.decode("utf-8", errors="replace").splitlines():
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    log.warning("skipping a torn line in %s", self.storage.url(METRICS_FILE))
        return rows

    def append_metrics(self, iteration: int, metrics: dict[str, Any], key: str = "iteration") -> bool:
        """Append one metrics line unless one exists for this iteration (and key kind).

        Returns whether a line was written. Resumed runs therefore never duplicate lines,
        and a row torn by a crash (not committed, see :meth:`read_metrics`) is written again.
        """
        existing = {(row.get("kind", "train"), row.get(key)) for row in self.read_metrics()}
        kind = metrics.get("kind", "train")
        if (kind, iteration) in existing:
            return False
        row = {key: iteration, "kind": kind, **{k: v for k, v in metrics.items() if k != "kind"}}
        self.storage.append_line(METRICS_FILE, json.dumps(row, sort_keys=True, allow_nan=True))
        return True


class RunStore:
    """All runs under one base location (``./runs`` by default, or an fsspec URL)."""

    def __init__(self, base: str = "./runs"):
        self.base = base
        self.storage = Storage(base)

    def run_storage(self, run_id: str) -> Storage:
        return self.storage.child(validate_run_id(run_id))

    def exists(self, run_id: str) -> bool:
        return self.run_storage(run_id).exists(PARAMS_FILE)

    def list_runs(self) -> list[str]:
        return [n for n in self.storage.listdir("") if self.storage.exists(f"{n}/{PARAMS_FILE}")]

    def load_params(self, run_id: str) -> HyperParameters:
        storage = self.run_storage(run_id)
        if not storage.exists(PARAMS_FILE):
            raise RunNotFoundError(run_id, storage.full(""))
        try:
            data = json.loads(storage.read_bytes(PARAMS_FILE))
        except ValueError as e:
            raise CorruptCheckpointError(storage.full(PARAMS_FILE), f"invalid JSON ({e})") from None
        return HyperParameters.from_dict(data, source=storage.full(PARAMS_FILE), stored=True)

    def open_run(
        self,
        run_id: str,
        params: HyperParameters | None = None,
        *,
        on_params_mismatch: ParamsMismatchPolicy = "refuse",
    ) -> Run:
        """Create a run, or open an existing one.

        ``params=None`` opens an existing run with its stored parameters (resume).
        With params given and a run already present, the stored parameters must be
        equal, unless ``on_params_mismatch`` is ``"warn"`` (log and continue with the new
        parameters) or ``"force"`` (overwrite silently). Differences are recorded in
        ``metadata.params_history``.
        """
        storage = self.run_storage(run_id)
        existing = storage.exists(PARAMS_FILE)
        if params is None:
            return Run(storage, run_id, self.load_params(run_id))
        run = Run(storage, run_id, params)
        if not existing:
            now = _now()
            with storage.locked(METADATA_LOCK):  # a new entry: whatever a deleted one left is replaced
                run.write_json(METADATA_FILE, {
                    "run_id": run_id, "incarnation": new_incarnation(), "package_name": "nipflow",
                    "package_version": package_version(), "params_hash": run.params_hash, "created": now,
                    "updated": now, "scenario": params.scenario, "trainer": params.trainer,
                    "interaction_protocol": params.interaction_protocol,
                })
            storage.write_bytes(PARAMS_FILE, (params.to_json() + "\n").encode())
            return run
        stored = self.load_params(run_id)
        differing = diff_params(stored.to_dict(), params.to_dict())
        if differing:
            if on_params_mismatch == "refuse":
                raise ParamsMismatchError(run_id, differing, storage.full(PARAMS_FILE))
            if on_params_mismatch == "warn":
                log.warning("run %s: hyper-parameters differ from the stored ones in %s; continuing "
                            "with the new ones", run_id, ", ".join(differing))
            entry = {"at": _now(), "previous_hash": stored.params_hash(), "fields": differing,
                     "policy": on_params_mismatch}
            storage.write_bytes(PARAMS_FILE, (params.to_json() + "\n").encode())
            run._modify_metadata(lambda meta: {"params_hash": run.params_hash,
                                               "params_history": [*meta.get("params_history", []), entry]})
        return run

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

The mutable files (state, metadata, metrics, fine-tune records, the suspension counts) get
an epoch tag once a driver has taken the run over from one that never released it
(``state.g0000000003.json``); :class:`Run` reads and writes them by their plain names and
finds the right version (:mod:`nip_core.runs.fencing`). Everything else is written once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import posixpath
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
from nip_core.runs import fencing
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
        self.accepted_params_hashes = params.accepted_params_hashes()  # with those older code wrote
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

    # -- where a file is stored -------------------------------------------------------------

    def _epoch(self) -> int | None:
        """The epoch this process drives the run in (None: it does not hold the lease)."""
        return self.lock.epoch if self.lock.generation is not None else None

    def stored_name(self, rel: str) -> str | None:
        """Where ``rel`` is read from: itself, or for a mutable file its version to read (None: absent).

        A driver reads the newest version at or below its own epoch; anybody else the newest.
        """
        if not fencing.is_mutable(rel):
            return rel if self.storage.exists(rel) else None
        return fencing.resolve(self.storage, rel, self._epoch())

    def _write_name(self, rel: str) -> str:
        """Where a write of ``rel`` goes: the driver's epoch; without the lease, the newest version."""
        if not fencing.is_mutable(rel):
            return rel
        epoch = self._epoch()
        if epoch is not None:
            return fencing.tagged(rel, epoch)
        return fencing.resolve(self.storage, rel) or rel

    def _read_bytes(self, rel: str) -> bytes:
        """The content of ``rel`` (its version to read); ``FileNotFoundError`` if absent."""
        name = self.stored_name(rel) if fencing.is_mutable(rel) else rel
        if name is None:
            raise FileNotFoundError(self.storage.full(rel))
        return self.storage.read_bytes(name)

    def list_files(self, directory: str) -> list[str]:
        """The names of a folder's files (for a folder of mutable files, without their epoch tags)."""
        if directory in fencing.MUTABLE_DIRS:
            return fencing.logical_names(self.storage, directory)
        return self.storage.listdir(directory)

    # -- JSON ------------------------------------------------------------------------------

    def write_json(self, rel: str, obj: Any) -> None:
        """Replace ``rel`` (a mutable file: its version of this driver's epoch) atomically."""
        self.storage.write_bytes(self._write_name(rel), json_record_bytes(obj))

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

    def write_json_keep_first(self, rel: str, obj: Any, what: str = "file") -> Any:
        """Create ``rel`` with ``obj`` unless it exists; the content that stands (the first written).

        For records of work that may be done again after a crash (a stage's summary): the
        first record is what readers may already have acted on. A driver that lost its lease
        gets ``LeaseLostError`` instead of the stored record.
        """
        if self.storage.create_exclusive(rel, json_record_bytes(obj)):
            return obj
        self.check_lease()
        return self.read_json(rel, what)

    def read_json(self, rel: str, what: str = "file") -> Any:
        try:
            raw = self._read_bytes(rel)
        except FileNotFoundError:
            raise CheckpointNotFoundError(self.storage.full(rel), what) from None
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise CorruptCheckpointError(self.storage.full(rel), f"invalid JSON ({e})") from None

    def exists(self, rel: str) -> bool:
        if fencing.is_mutable(rel):
            return self.stored_name(rel) is not None
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
        return self.exists(STATE_FILE)

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
        """Apply ``change(meta)`` (fields to set, or None for none) under the metadata lock.

        The lock belongs to the version written (one per epoch): a driver paused while it
        held the lock of its epoch never blocks the driver that took the run over.
        """
        target = self._write_name(METADATA_FILE)
        lock = METADATA_LOCK if target == METADATA_FILE else f"leases/{posixpath.basename(target)[:-5]}.lock"
        with self.storage.locked(lock):
            try:
                meta = json.loads(self._read_bytes(METADATA_FILE))
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

    def save_checkpoint_bytes(self, name: str, data: bytes, **info: Any) -> str:
        """Write checkpoint ``name``: its data file, then its manifest (sha256, params hash, info).

        Both are written once (created exclusively), so a driver that lost the run while
        paused can never put its tensors or its manifest in place of the new driver's. The
        data goes to ``checkpoints/<name>.pt``, or, if a file of other bytes is already
        there (left by a driver that stopped before its manifest), to the content-addressed
        ``checkpoints/<name>.<sha256[:16]>.pt``. The manifest names its data file and is the
        commit point: a checkpoint without one does not exist for readers. A manifest that
        is already there for the same data is kept (a repeated save); one for other data is
        an error (``LeaseLostError`` if this driver lost its lease, else
        ``WriteOnceConflictError``). Returns the data file's path in the run.
        """
        self.check_lease()
        sha = hashlib.sha256(data).hexdigest()
        data_rel = f"checkpoints/{name}.pt"
        if not self.storage.create_exclusive(data_rel, data) and self.storage.read_bytes(data_rel) != data:
            data_rel = f"checkpoints/{name}.{sha[:16]}.pt"
            self.storage.create_exclusive(data_rel, data)  # named by its content: an existing one is equal
        manifest = {"name": name, "sha256": sha, "size": len(data), "params_hash": self.params_hash,
                    "saved_at": _now(), "data": posixpath.basename(data_rel), **info}
        manifest_rel = f"checkpoints/{name}.json"
        if self.storage.create_exclusive(manifest_rel, json_record_bytes(manifest)):
            return data_rel
        try:
            existing = self.read_json(manifest_rel, "checkpoint manifest")
        except CorruptCheckpointError:
            existing = {}
        if existing.get("sha256") == sha and existing.get("params_hash") in self.accepted_params_hashes:
            return f"checkpoints/{existing.get('data', f'{name}.pt')}"
        self.check_lease()
        raise WriteOnceConflictError(self.storage.url(manifest_rel), "checkpoint manifest")

    def checkpoint_data_rel(self, name: str, manifest: dict[str, Any] | None = None) -> str:
        """The data file of checkpoint ``name`` as its manifest names it (``<name>.pt`` for older ones)."""
        if manifest is None:
            manifest = self.read_json(f"checkpoints/{name}.json", "checkpoint manifest")
        data_name = str(manifest.get("data") or f"{name}.pt")
        if "/" in data_name or not data_name.startswith(f"{name}.") or not data_name.endswith(".pt"):
            raise CorruptCheckpointError(self.storage.full(f"checkpoints/{name}.json"),
                                         f"names a data file outside the checkpoint ({data_name!r})")
        return f"checkpoints/{data_name}"

    def load_checkpoint_bytes(self, name: str) -> tuple[bytes, dict[str, Any]]:
        """Read a checkpoint, verifying checksum and params hash."""
        manifest_rel = f"checkpoints/{name}.json"
        manifest = self.read_json(manifest_rel, "checkpoint manifest")
        data_rel = self.checkpoint_data_rel(name, manifest)
        try:
            data = self.storage.read_bytes(data_rel)
        except FileNotFoundError:
            raise CheckpointNotFoundError(self.storage.full(data_rel)) from None
        if hashlib.sha256(data).hexdigest() != manifest.get("sha256"):
            raise CorruptCheckpointError(self.storage.full(data_rel),
                                         "sha256 does not match its manifest")
        if manifest.get("params_hash") not in self.accepted_params_hashes:
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
        try:
            data = self._read_bytes(METRICS_FILE)
        except FileNotFoundError:
            return []
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
        target = self._write_name(METRICS_FILE)
        newest = self.stored_name(METRICS_FILE)
        if newest is not None and newest != target:
            # The first line of this epoch (the file did not exist when the run was sealed):
            # carry the earlier lines over first, created exclusively like a seal's copy.
            self.storage.create_exclusive(target, self.storage.read_bytes(newest))
        self.storage.append_line(target, json.dumps(row, sort_keys=True, allow_nan=True))
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

"""SQLite persistence of the local server: files, jobs, events, checkpoints, models.

One database file (``state.sqlite3`` in the data directory, WAL journal) holds every
record as JSON next to the few columns that are queried. Writes commit at once, so a
killed server (even by SIGKILL) loses nothing it has acknowledged. One connection is
shared by the event loop and the job workers behind a lock; every statement is short.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel

from nipflow_llm_server.server.records import CheckpointRecord, EventRecord, FileRecord, JobRecord, ModelRecord

T = TypeVar("T", bound=BaseModel)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL,
    purpose TEXT NOT NULL, path TEXT NOT NULL, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL,
    status TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,
    cancel_requested INTEGER NOT NULL DEFAULT 0, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS events (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL,
    job_id TEXT NOT NULL, data TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS events_job ON events (job_id, seq);
CREATE TABLE IF NOT EXISTS checkpoints (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL,
    job_id TEXT NOT NULL, data TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS checkpoints_job ON checkpoints (job_id, seq);
CREATE TABLE IF NOT EXISTS models (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL,
    job_id TEXT NOT NULL, listed INTEGER NOT NULL, data TEXT NOT NULL);
"""


class Page(BaseModel):
    """One page of a cursor-paginated list."""

    data: list[dict]
    has_more: bool

    def body(self) -> dict:
        out: dict = {"object": "list", "data": self.data, "has_more": self.has_more}
        out["first_id"] = self.data[0]["id"] if self.data else None
        out["last_id"] = self.data[-1]["id"] if self.data else None
        return out


class UnknownCursorError(LookupError):
    """The ``after`` cursor names no record of the list."""


class Store:
    """The server's database (see the module docstring)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _all(self, sql: str, args: tuple = ()) -> list[tuple]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    def _one(self, sql: str, args: tuple = ()) -> tuple | None:
        with self._lock:
            return self._db.execute(sql, args).fetchone()

    def _write(self, sql: str, args: tuple = ()) -> int:
        with self._lock:
            return self._db.execute(sql, args).rowcount

    # -- pagination ------------------------------------------------------------------------

    def _page(
        self,
        table: str,
        record: type[T],
        where: str,
        args: tuple,
        after: str | None,
        limit: int,
        descending: bool = True,
        keep: Callable[[T], bool] | None = None,
    ) -> tuple[list[T], bool]:
        if after is not None:
            row = self._one(f"SELECT seq FROM {table} WHERE id = ?", (after,))
            if row is None:
                raise UnknownCursorError(after)
            where += f" AND seq {'<' if descending else '>'} ?"
            args = (*args, row[0])
        order = "DESC" if descending else "ASC"
        out: list[T] = []
        for (data,) in self._iter(f"SELECT data FROM {table} WHERE {where} ORDER BY seq {order}", args):
            item = record.model_validate_json(data)
            if keep is None or keep(item):
                out.append(item)
                if len(out) > limit:
                    break
        return out[:limit], len(out) > limit

    def _iter(self, sql: str, args: tuple, batch: int = 256) -> Iterator[tuple]:
        # fetch in batches so that a long filtered scan does not hold the lock throughout
        offset = 0
        while True:
            rows = self._all(f"{sql} LIMIT ? OFFSET ?", (*args, batch, offset))
            yield from rows
            if len(rows) < batch:
                return
            offset += batch

    # -- files -----------------------------------------------------------------------------

    def add_file(self, record: FileRecord, path: str) -> None:
        self._write(
            "INSERT OR REPLACE INTO files (id, purpose, path, data) VALUES (?, ?, ?, ?)",
            (record.id, record.purpose, path, record.model_dump_json()),
        )

    def get_file(self, file_id: str) -> tuple[FileRecord, str] | None:
        row = self._one("SELECT data, path FROM files WHERE id = ?", (file_id,))
        return None if row is None else (FileRecord.model_validate_json(row[0]), row[1])

    def list_files(self, purpose: str | None, after: str | None, limit: int, order: str) -> tuple[list[FileRecord], bool]:
        where, args = ("purpose = ?", (purpose,)) if purpose else ("1 = 1", ())
        return self._page("files", FileRecord, where, args, after, limit, descending=(order == "desc"))

    def delete_file(self, file_id: str) -> bool:
        return self._write("DELETE FROM files WHERE id = ?", (file_id,)) > 0

    # -- jobs ------------------------------------------------------------------------------

    def add_job(self, job: JobRecord) -> None:
        self._write("INSERT INTO jobs (id, status, data) VALUES (?, ?, ?)", (job.id, job.status, job.model_dump_json()))

    def save_job(self, job: JobRecord) -> None:
        self._write("UPDATE jobs SET status = ?, data = ? WHERE id = ?", (job.status, job.model_dump_json(), job.id))

    def get_job(self, job_id: str) -> JobRecord | None:
        row = self._one("SELECT data FROM jobs WHERE id = ?", (job_id,))
        return None if row is None else JobRecord.model_validate_json(row[0])

    def list_jobs(
        self, after: str | None, limit: int, keep: Callable[[JobRecord], bool] | None = None
    ) -> tuple[list[JobRecord], bool]:
        return self._page("jobs", JobRecord, "1 = 1", (), after, limit, keep=keep)

    def jobs_with_status(self, statuses: tuple[str, ...]) -> list[JobRecord]:
        marks = ",".join("?" for _ in statuses)
        rows = self._all(f"SELECT data FROM jobs WHERE status IN ({marks}) ORDER BY seq", statuses)
        return [JobRecord.model_validate_json(r[0]) for r in rows]

    def job_attempts(self, job_id: str) -> int:
        row = self._one("SELECT attempts FROM jobs WHERE id = ?", (job_id,))
        return 0 if row is None else int(row[0])

    def add_attempt(self, job_id: str) -> int:
        self._write("UPDATE jobs SET attempts = attempts + 1 WHERE id = ?", (job_id,))
        return self.job_attempts(job_id)

    def request_cancel(self, job_id: str) -> None:
        self._write("UPDATE jobs SET cancel_requested = 1 WHERE id = ?", (job_id,))

    def cancel_requested(self, job_id: str) -> bool:
        row = self._one("SELECT cancel_requested FROM jobs WHERE id = ?", (job_id,))
        return bool(row and row[0])

    # -- events and checkpoints ------------------------------------------------------------

    def add_event(self, job_id: str, event: EventRecord) -> None:
        self._write("INSERT INTO events (id, job_id, data) VALUES (?, ?, ?)", (event.id, job_id, event.model_dump_json()))

    def list_events(self, job_id: str, after: str | None, limit: int) -> tuple[list[EventRecord], bool]:
        return self._page("events", EventRecord, "job_id = ?", (job_id,), after, limit)

    def add_checkpoint(self, checkpoint: CheckpointRecord) -> None:
        self._write(
            "INSERT OR REPLACE INTO checkpoints (id, job_id, data) VALUES (?, ?, ?)",
            (checkpoint.id, checkpoint.fine_tuning_job_id, checkpoint.model_dump_json()),
        )

    def list_checkpoints(self, job_id: str, after: str | None, limit: int) -> tuple[list[CheckpointRecord], bool]:
        return self._page("checkpoints", CheckpointRecord, "job_id = ?", (job_id,), after, limit)

    def delete_checkpoints(self, job_id: str) -> None:
        self._write("DELETE FROM checkpoints WHERE job_id = ?", (job_id,))

    # -- models ----------------------------------------------------------------------------

    def add_model(self, model: ModelRecord) -> None:
        self._write(
            "INSERT OR REPLACE INTO models (id, job_id, listed, data) VALUES (?, ?, ?, ?)",
            (model.id, model.job_id, int(model.listed), model.model_dump_json()),
        )

    def get_model(self, model_id: str) -> ModelRecord | None:
        row = self._one("SELECT data FROM models WHERE id = ?", (model_id,))
        return None if row is None else ModelRecord.model_validate_json(row[0])

    def list_models(self) -> list[ModelRecord]:
        rows = self._all("SELECT data FROM models WHERE listed = 1 ORDER BY seq")
        return [ModelRecord.model_validate_json(r[0]) for r in rows]

    def delete_model(self, model_id: str) -> bool:
        return self._write("DELETE FROM models WHERE id = ?", (model_id,)) > 0


"""Byte storage under a base location: a local directory or any fsspec URL.

The run store only needs a handful of operations; keeping them behind this small
interface lets a run live on a shared filesystem or object store (``s3://...``,
``memory://...``) with the same code. Local writes are durable and atomic (temp
file, fsync, ``os.replace``); remote writes are atomic where the backend's ``mv`` is.
"""

from __future__ import annotations

import logging
import os
import posixpath
import uuid
from pathlib import Path

import fsspec

from nip_core.utils.fileio import atomic_write_bytes, fsync_directory

log = logging.getLogger(__name__)

# How far back a torn tail is searched for its line start per read (local files).
_TAIL_CHUNK = 64 * 1024


def _lock_exclusive(fd: int) -> None:
    """An advisory exclusive lock on ``fd``, where the platform and filesystem have one."""
    try:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_EX)
    except (ImportError, OSError):
        pass  # no flock here (Windows, some network filesystems): appends stay unserialised


def is_url(location: str) -> bool:
    return "://" in str(location) and not str(location).startswith("file://")


class Storage:
    """Files addressed by ``/``-separated relative paths under ``root``."""

    def __init__(self, root: str | Path):
        root = str(root)
        if root.startswith("file://"):
            root = root[len("file://"):]
        self.root = root
        self.local = not is_url(root)
        if self.local:
            self.root = str(Path(root).absolute())
            self._fs = None
        else:
            self._fs, self._base = fsspec.core.url_to_fs(root)

    # -- paths ---------------------------------------------------------------------------

    def full(self, rel: str) -> str:
        if self.local:
            return os.path.join(self.root, *rel.split("/")) if rel else self.root
        return posixpath.join(self._base, rel) if rel else self._base

    def url(self, rel: str = "") -> str:
        """A location string that another process can open (path or URL)."""
        if self.local:
            return self.full(rel)
        protocol = self._fs.protocol[0] if isinstance(self._fs.protocol, (tuple, list)) else self._fs.protocol
        return f"{protocol}://{self.full(rel)}"

    def child(self, rel: str) -> "Storage":
        return Storage(self.url(rel))

    # -- queries -------------------------------------------------------------------------

    def exists(self, rel: str) -> bool:
        return os.path.exists(self.full(rel)) if self.local else self._fs.exists(self.full(rel))

    def listdir(self, rel: str = "") -> list[str]:
        """Names (not paths) of the entries of a directory; empty if it does not exist."""
        full = self.full(rel)
        if self.local:
            return sorted(os.listdir(full)) if os.path.isdir(full) else []
        if not self._fs.exists(full):
            return []
        return sorted(posixpath.basename(p.rstrip("/")) for p in self._fs.ls(full, detail=False))

    def makedirs(self, rel: str) -> None:
        if self.local:
            os.makedirs(self.full(rel), exist_ok=True)
        else:
            self._fs.makedirs(self.full(rel), exist_ok=True)

    # -- reads and writes ----------------------------------------------------------------

    def read_bytes(self, rel: str) -> bytes:
        """Raises ``FileNotFoundError`` if absent."""
        if self.local:
            with open(self.full(rel), "rb") as f:
                return f.read()
        with self._fs.open(self.full(rel), "rb") as f:
            return f.read()

    def write_bytes(self, rel: str, data: bytes) -> None:
        """Atomically replace ``rel`` with ``data`` (readers see old or new, never half)."""
        full = self.full(rel)
        if self.local:
            atomic_write_bytes(full, data)
            return
        self._fs.makedirs(posixpath.dirname(full), exist_ok=True)
        tmp = posixpath.join(posixpath.dirname(full), f".tmp-{uuid.uuid4().hex}")
        with self._fs.open(tmp, "wb") as f:
            f.write(data)
        self._fs.mv(tmp, full)

    def append_line(self, rel: str, line: str) -> None:
        """Append one line (newline added). Local appends are a single ``write`` + fsync.

        A file that does not end with a newline has a torn last line (a crash cut an
        append short): that tail was never a committed line, so it is cut off first
        (with a warning naming the file) instead of gluing the new line onto it. Locally
        the file is truncated in place and fsynced; on object stores the rewrite that
        appends is atomic anyway.
        """
        data = (line.rstrip("\n") + "\n").encode()
        full = self.full(rel)
        if self.local:
            os.makedirs(os.path.dirname(full), exist_ok=True)
            fd = os.open(full, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                # Serialise appenders of this file, so that one never mistakes another's
                # line in progress for a torn tail (released by close).
                _lock_exclusive(fd)
                self._cut_torn_tail_local(fd, full)
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            return
        # Object stores have no append: rewrite atomically.
        old = self.read_bytes(rel) if self.exists(rel) else b""
        if old and not old.endswith(b"\n"):
            keep = old.rfind(b"\n") + 1
            log.warning("%s: dropping a torn last line (%d bytes without a newline, never committed)",
                        self.url(rel), len(old) - keep)
            old = old[:keep]
        self.write_bytes(rel, old + data)

    @staticmethod
    def _cut_torn_tail_local(fd: int, full: str) -> None:
        """Truncate the open file ``fd`` after its last newline if it does not end with one."""
        size = os.fstat(fd).st_size
        if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
            return
        # Search backwards chunk by chunk: lines are short, files may be long.
        end = size
        keep = 0
        while end > 0:
            start = max(0, end - _TAIL_CHUNK)
            newline = os.pread(fd, end - start, start).rfind(b"\n")
            if newline >= 0:
                keep = start + newline + 1
                break
            end = start
        log.warning("%s: dropping a torn last line (%d bytes without a newline, never committed)",
                    full, size - keep)
        os.ftruncate(fd, keep)
        os.fsync(fd)

    def create_exclusive(self, rel: str, data: bytes) -> bool:
        """Create ``rel`` with ``data`` only if it does not exist; return whether this call did.

        The file appears complete or not at all: locally it is written to a temp file and
        hard-linked into place (``link`` fails if the name exists, atomically, also on
        NFS); on object stores it is one conditional ``PUT`` (``If-None-Match: *``, which
        S3 honours through s3fs). Backends without a conditional create fall back to
        check-then-write, which is safe on one host only (see docs/deployment.md).
        """
        full = self.full(rel)
        if self.local:
            directory = os.path.dirname(full)
            os.makedirs(directory, exist_ok=True)
            tmp = os.path.join(directory, f".tmp-{uuid.uuid4().hex}")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(tmp, full)
            except FileExistsError:
                return False
            finally:
                os.unlink(tmp)
            fsync_directory(directory)
            return True
        self._fs.makedirs(posixpath.dirname(full), exist_ok=True)
        try:
            self._fs.pipe_file(full, data, mode="create")
        except FileExistsError:
            return False
        return True

    def remove(self, rel: str) -> None:
        try:
            if self.local:
                os.unlink(self.full(rel))
            else:
                self._fs.rm(self.full(rel))
        except FileNotFoundError:
            pass

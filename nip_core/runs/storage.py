"""Byte storage under a base location: a local directory or any fsspec URL.

The run store only needs a handful of operations; keeping them behind this small
interface lets a run live on a shared filesystem or object store (``s3://...``,
``memory://...``) with the same code.

* Local writes are durable and atomic (temp file, fsync, ``os.replace``). On object
  stores (S3, GCS, Azure) a write is one ``PUT``, which replaces the object atomically:
  nothing else is ever created, so a killed write leaves no temporary object. Other
  remote filesystems write a ``.tmp-*`` file and ``mv`` it (atomic where their ``mv``
  is). Listings never show ``.tmp-*`` names, including ones older versions left behind.
* Remote reads are always fresh: filesystems are opened with fsspec's listings cache
  off, and a file is read with one ``GET`` (no size or ETag remembered from an earlier
  listing), so a reader sees what other processes wrote at once (leases, state, metadata,
  metrics). On S3, a read that still finds its object replaced under it (s3fs's
  ``FileExpired``) is read again.
* S3 calls have short connect/read timeouts and few attempts (:data:`S3_CONFIG`), so one
  stalled request does not hold a caller for minutes; callers with a deadline (lease
  renewals) pass ``timeout_s`` as well, which bounds the whole call on asynchronous
  filesystems (a request still in flight may land afterwards).
"""

from __future__ import annotations

import logging
import os
import posixpath
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import fsspec
import fsspec.utils

from nip_core.utils.fileio import atomic_write_bytes, fsync_directory, write_all

log = logging.getLogger(__name__)

# How far back a torn tail is searched for its line start per read (local files).
_TAIL_CHUNK = 64 * 1024
# Names of the temporary files of writes; never listed.
TMP_PREFIX = ".tmp-"
# Object stores: one PUT replaces an object atomically, there are no directories.
_OBJECT_STORES = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss"})
_S3 = frozenset({"s3", "s3a"})
# botocore settings of the run store's S3 client: a stalled request fails within seconds
# (by default: 15 s per read (s3fs), 5 attempts (botocore), and s3fs repeats those up to 5 times).
S3_CONFIG: dict[str, Any] = {"connect_timeout": 3, "read_timeout": 5,
                             "retries": {"max_attempts": 3, "mode": "standard"}}
# s3fs's own attempts around botocore's (botocore's standard mode retries already).
_S3FS_ATTEMPTS = 1
# Reads of an object replaced while it was read are repeated this often.
_READ_ATTEMPTS = 3

_process_locks: dict[str, threading.Lock] = {}
_process_locks_guard = threading.Lock()


def _lock_exclusive(fd: int) -> None:
    """An advisory exclusive lock on ``fd``, where the platform and filesystem have one."""
    try:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_EX)
    except (ImportError, OSError):
        pass  # no flock here (Windows, some network filesystems): appends stay unserialised


def _process_lock(key: str) -> threading.Lock:
    with _process_locks_guard:
        return _process_locks.setdefault(key, threading.Lock())


def is_url(location: str) -> bool:
    return "://" in str(location) and not str(location).startswith("file://")


def _open_remote(root: str) -> tuple[Any, str, str]:
    """``(filesystem, base path, protocol)`` of ``root``, configured for fresh reads."""
    protocol = fsspec.utils.get_protocol(root)
    options: dict[str, Any] = {"use_listings_cache": False}
    if protocol in _S3:
        options["config_kwargs"] = {**S3_CONFIG, "retries": dict(S3_CONFIG["retries"])}
    # fsspec shares one instance per set of options: all run stores of this process use
    # one client (creating one costs ~0.5 s), never one configured otherwise by others.
    fs, base = fsspec.core.url_to_fs(root, **options)
    if protocol in _S3:
        fs.retries = _S3FS_ATTEMPTS
    return fs, base, protocol


def _replaced_errors(protocol: str) -> tuple[type[BaseException], ...]:
    """The errors of a read whose object was replaced while it was read."""
    if protocol in _S3:
        from s3fs.utils import FileExpired

        return (FileExpired,)
    return ()


class Storage:
    """Files addressed by ``/``-separated relative paths under ``root``.

    ``timeout_s`` (reads, writes, listings, exclusive creates): on asynchronous remote
    filesystems (S3) the call raises ``TimeoutError`` after that many seconds; a write
    that timed out may still land. Local calls ignore it.
    """

    def __init__(self, root: str | Path):
        root = str(root)
        if root.startswith("file://"):
            root = root[len("file://"):]
        self.root = root
        self.local = not is_url(root)
        self._object_store = False
        self._replaced: tuple[type[BaseException], ...] = ()
        self._read_options: dict[str, Any] = {}
        if self.local:
            self.root = str(Path(root).absolute())
            self._fs = None
        else:
            self._fs, self._base, protocol = _open_remote(root)
            self._object_store = protocol in _OBJECT_STORES
            self._replaced = _replaced_errors(protocol)
            if protocol in _S3:
                self._read_options = {"max_concurrency": 1}  # one GET: one version of the object

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

    def _call(self, method: str, *args: Any, timeout_s: float | None = None, **kwargs: Any) -> Any:
        """A call of the remote filesystem, bounded by ``timeout_s`` where it is asynchronous."""
        if timeout_s is not None and getattr(self._fs, "async_impl", False):
            if timeout_s <= 0:
                raise TimeoutError(f"{method} {args[0] if args else ''}: no time left")
            kwargs["timeout"] = timeout_s  # fsspec's sync(): cancels the call when it is over
        return getattr(self._fs, method)(*args, **kwargs)

    # -- queries -------------------------------------------------------------------------

    def exists(self, rel: str) -> bool:
        return os.path.exists(self.full(rel)) if self.local else self._fs.exists(self.full(rel))

    def listdir(self, rel: str = "", *, timeout_s: float | None = None) -> list[str]:
        """Names (not paths) of the entries of a directory; empty if it does not exist.

        Temporary files of writes (``.tmp-*``, also those a killed write of an older
        version left on an object store) are never listed.
        """
        full = self.full(rel)
        if self.local:
            names = os.listdir(full) if os.path.isdir(full) else []
        else:
            try:
                paths = self._call("ls", full, detail=False, timeout_s=timeout_s)
            except FileNotFoundError:
                return []
            names = [posixpath.basename(p.rstrip("/")) for p in paths]
        return sorted(n for n in names if not n.startswith(TMP_PREFIX))

    def makedirs(self, rel: str) -> None:
        if self.local:
            os.makedirs(self.full(rel), exist_ok=True)
        elif not self._object_store:
            self._fs.makedirs(self.full(rel), exist_ok=True)

    # -- reads and writes ----------------------------------------------------------------

    def read_bytes(self, rel: str, *, timeout_s: float | None = None) -> bytes:
        """The current content of ``rel``; raises ``FileNotFoundError`` if absent."""
        full = self.full(rel)
        if self.local:
            with open(full, "rb") as f:
                return f.read()
        for attempt in range(1, _READ_ATTEMPTS + 1):
            try:
                return self._call("cat_file", full, timeout_s=timeout_s, **self._read_options)
            except self._replaced:
                # Replaced while being read (by another writer): read the new version.
                if attempt == _READ_ATTEMPTS:
                    raise
                self._fs.invalidate_cache(full)
        raise AssertionError("unreachable")  # pragma: no cover

    def write_bytes(self, rel: str, data: bytes, *, timeout_s: float | None = None) -> None:
        """Atomically replace ``rel`` with ``data`` (readers see old or new, never half)."""
        full = self.full(rel)
        if self.local:
            atomic_write_bytes(full, data)
            return
        if self._object_store:
            self._call("pipe_file", full, data, timeout_s=timeout_s)  # one PUT
            return
        self._fs.makedirs(posixpath.dirname(full), exist_ok=True)
        tmp = posixpath.join(posixpath.dirname(full), f"{TMP_PREFIX}{uuid.uuid4().hex}")
        self._call("pipe_file", tmp, data, timeout_s=timeout_s)
        self._fs.mv(tmp, full)

    def append_line(self, rel: str, line: str) -> None:
        """Append one line (newline added). Local appends are one locked write + fsync.

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
                write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            return
        # Object stores have no append: rewrite atomically.
        try:
            old = self.read_bytes(rel)
        except FileNotFoundError:
            old = b""
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

    def create_exclusive(self, rel: str, data: bytes, *, timeout_s: float | None = None) -> bool:
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
            tmp = os.path.join(directory, f"{TMP_PREFIX}{uuid.uuid4().hex}")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                try:
                    write_all(fd, data)
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.link(tmp, full)
            except FileExistsError:
                return False
            finally:
                os.unlink(tmp)
            fsync_directory(directory)
            return True
        if not self._object_store:
            self._fs.makedirs(posixpath.dirname(full), exist_ok=True)
        try:
            self._call("pipe_file", full, data, mode="create", timeout_s=timeout_s)
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

    @contextmanager
    def locked(self, lock_rel: str) -> Iterator[None]:
        """Hold the exclusive lock named by the file ``lock_rel`` (not re-entrant).

        For read-modify-writes of a file by several threads or processes. Within this
        process it is a thread lock per name. Locally it is also a ``flock`` on the file
        ``lock_rel`` (created empty, and left in place: removing a lock file would let two
        holders lock two different files), which serialises the processes of this host,
        and of all hosts on NFS, where flock is honoured. Object stores have no lock and
        nothing is written there: across processes the caller must rely on something else
        (the run lease keeps other drivers of a run out).
        """
        with _process_lock(self.url(lock_rel)):
            if not self.local:
                yield
                return
            full = self.full(lock_rel)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            fd = os.open(full, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                _lock_exclusive(fd)  # released by close
                yield
            finally:
                os.close(fd)

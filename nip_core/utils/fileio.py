"""Durable, atomic file writes, file digests and process liveness checks shared across nip_core."""

from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path


def file_sha256(path: str | os.PathLike) -> str:
    """The hex sha256 of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def atomic_write_bytes(path: str | os.PathLike, data: bytes, mode: int = 0o666) -> None:
    """Replace ``path`` with ``data`` so readers see the old or the new file, never half.

    Writes a temporary file in the same directory (created with ``mode & ~umask``), fsyncs
    it, renames it over ``path`` and fsyncs the directory: the rename is only durable once
    the directory entry is on disk, otherwise a host crash can bring back the old file (or
    none) although the call returned. Directories this call creates are made durable the
    same way (their parents are fsynced). The temporary file is removed on any failure.
    """
    path = Path(path)
    _make_parents_durably(path.parent)
    tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(6)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)


def write_all(fd: int, data: bytes) -> None:
    """``os.write`` until every byte of ``data`` is written.

    ``os.write`` may write fewer bytes than asked (a signal, a pipe, a file size limit);
    the rest is written by further calls. An error of a later call (``EFBIG``,
    ``ENOSPC``) is raised: the caller never mistakes a partial write for a whole one.
    """
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:  # pragma: no cover - os.write raises instead on every known platform
            raise OSError(f"os.write wrote nothing ({len(view)} bytes left)")
        view = view[written:]


def _make_parents_durably(directory: Path) -> None:
    """``mkdir -p directory``, fsyncing the parent of every directory it creates.

    Costs nothing when ``directory`` exists already (the common case: one stat).
    """
    if directory.is_dir():
        return
    missing = []
    current = directory
    while not current.exists() and current != current.parent:
        missing.append(current)
        current = current.parent
    directory.mkdir(parents=True, exist_ok=True)
    # Outermost first: each new entry is durable before the one inside it.
    for created in reversed(missing):
        fsync_directory(created.parent)


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host (zombies count as dead)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def fsync_directory(directory: str | os.PathLike) -> None:
    """fsync a directory so that a rename or link in it survives a crash of the host.

    Filesystems that cannot fsync a directory (EINVAL, ENOTSUP, EBADF) are accepted as
    they are.
    """
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
    try:
        fd = os.open(directory, flags)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as e:
        import errno

        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)

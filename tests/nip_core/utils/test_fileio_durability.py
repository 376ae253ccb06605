"""atomic_write_bytes makes its rename (and the directories it creates) durable."""

from __future__ import annotations

import errno
import os
import stat

import pytest

from nip_core.utils import fileio


@pytest.fixture
def fsync_log(monkeypatch):
    """Record every fsync as (kind, inode, dir entries at fsync time) and then do it."""
    calls = []
    real_fsync = os.fsync

    def recording_fsync(fd):
        info = os.fstat(fd)
        is_dir = stat.S_ISDIR(info.st_mode)
        # For a directory, remember which names it held: shows the fsync came after the rename.
        entries = sorted(os.listdir(f"/proc/self/fd/{fd}")) if is_dir else None
        calls.append(("dir" if is_dir else "file", info.st_ino, entries))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    return calls


def test_directory_is_fsynced_after_the_replace(tmp_path, fsync_log):
    target = tmp_path / "state.json"
    target.write_bytes(b"old")
    fsync_log.clear()
    fileio.atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"new"
    kinds = [kind for kind, _, _ in fsync_log]
    assert kinds == ["file", "dir"]  # the data first, then the directory holding the rename
    _, inode, entries = fsync_log[1]
    assert inode == os.stat(tmp_path).st_ino
    assert entries == ["state.json"]  # the temp file was already renamed away


def test_created_directories_are_fsynced_in_their_parents(tmp_path, fsync_log):
    target = tmp_path / "a" / "b" / "c.json"
    fileio.atomic_write_bytes(target, b"x")
    dir_inodes = [inode for kind, inode, _ in fsync_log if kind == "dir"]
    expected = [os.stat(p).st_ino for p in (tmp_path, tmp_path / "a", tmp_path / "a" / "b")]
    # tmp_path gains "a", a gains "b" (both before the file), b gains c.json (after the replace)
    assert dir_inodes == expected
    assert [kind for kind, _, _ in fsync_log][-1] == "dir"


def test_existing_directory_costs_one_directory_fsync(tmp_path, fsync_log):
    fileio.atomic_write_bytes(tmp_path / "f", b"1")
    fsync_log.clear()
    fileio.atomic_write_bytes(tmp_path / "f", b"2")
    assert [kind for kind, _, _ in fsync_log].count("dir") == 1


@pytest.mark.parametrize("code", [errno.EINVAL, errno.ENOTSUP])
def test_filesystems_refusing_directory_fsync_are_accepted(tmp_path, monkeypatch, code):
    real_fsync = os.fsync

    def refusing(fd):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(code, os.strerror(code))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", refusing)
    fileio.atomic_write_bytes(tmp_path / "sub" / "f", b"data")
    assert (tmp_path / "sub" / "f").read_bytes() == b"data"


def test_other_directory_fsync_errors_are_raised(tmp_path, monkeypatch):
    """An I/O error means the rename may not be durable: the caller must hear of it."""
    real_fsync = os.fsync

    def failing(fd):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", failing)
    with pytest.raises(OSError) as info:
        fileio.atomic_write_bytes(tmp_path / "f", b"data")
    assert info.value.errno == errno.EIO

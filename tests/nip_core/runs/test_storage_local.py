"""Local run store details: whole writes despite short ``os.write``s, serialised metadata updates."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from nip_core.parameters import HyperParameters
from nip_core.runs.storage import Storage
from nip_core.runs.store import RunStore

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def short_writes(monkeypatch):
    """``os.write`` writes at most 7 bytes per call, as it may (pipes, signals, quotas)."""
    real_write = os.write
    calls = []

    def write(fd, data):
        calls.append(len(data))
        return real_write(fd, bytes(data[:7]))

    monkeypatch.setattr(os, "write", write)
    return calls


def test_append_line_and_exclusive_create_write_every_byte_despite_short_writes(tmp_path, short_writes):
    storage = Storage(tmp_path)
    line = json.dumps({"iteration": 3, "loss": 0.25, "pad": "x" * 40})
    storage.append_line("metrics.jsonl", line)
    storage.append_line("metrics.jsonl", line)
    assert (tmp_path / "metrics.jsonl").read_text() == line + "\n" + line + "\n"
    assert storage.create_exclusive("leases/run/0000000001.json", line.encode())
    assert (tmp_path / "leases" / "run" / "0000000001.json").read_text() == line
    assert len(short_writes) > 3 * len(line) // 7  # it did loop


def test_write_all_of_fileio_loops_until_every_byte_is_written(tmp_path, short_writes):
    from nip_core.utils.fileio import write_all

    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        write_all(fd, b"0123456789" * 5)
    finally:
        os.close(fd)
    assert (tmp_path / "f").read_bytes() == b"0123456789" * 5


FILE_SIZE_LIMIT = """
import resource, signal, sys
from nip_core.runs.storage import Storage
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
resource.setrlimit(resource.RLIMIT_FSIZE, (100, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
storage = Storage(sys.argv[1])
for what, call in (("append_line", lambda: storage.append_line("m.jsonl", "x" * 300)),
                   ("create_exclusive", lambda: storage.create_exclusive("c.json", b"y" * 300))):
    try:
        call()
        print(what, "returned", flush=True)
    except OSError as e:
        print(what, "raised", e.errno, flush=True)
"""


def test_a_write_cut_short_by_the_file_size_limit_is_an_error_not_a_torn_success(tmp_path):
    """A real short write (RLIMIT_FSIZE): the call must fail, not report a half-written line."""
    import errno

    out = subprocess.run([sys.executable, "-c", FILE_SIZE_LIMIT, str(tmp_path)], capture_output=True, text=True,
                         cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
    assert out.stdout.split("\n")[:2] == [f"append_line raised {errno.EFBIG}", f"create_exclusive raised {errno.EFBIG}"], \
        out.stdout + out.stderr[-2000:]
    assert not (tmp_path / "c.json").exists()  # no partial claim was linked into place
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp-")] == []


def _params() -> HyperParameters:
    return HyperParameters.from_dict({"scenario": "graph_isomorphism", "trainer": "vanilla_ppo", "dataset": "test"})


UPDATER = """
import sys
from nip_core.runs import RunStore
run = RunStore(sys.argv[1]).open_run("exp")
for i in range(10):
    run.update_metadata(**{f"p{sys.argv[2]}_{i}": i})
"""


@pytest.mark.slow
def test_metadata_updates_of_several_processes_and_threads_are_never_lost(tmp_path):
    run = RunStore(str(tmp_path)).open_run("exp", _params())
    procs = [subprocess.Popen([sys.executable, "-c", UPDATER, str(tmp_path), str(p)], cwd=REPO,
                              env={**os.environ, "PYTHONPATH": str(REPO)}) for p in range(3)]
    threads = [threading.Thread(target=lambda t=t: [run.update_metadata(**{f"t{t}_{i}": i}) for i in range(10)])
               for t in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert all(p.wait(timeout=120) == 0 for p in procs)
    meta = run.metadata()
    expected = {f"{who}_{i}" for who in ("p0", "p1", "p2", "t0", "t1") for i in range(10)}
    assert expected - set(meta) == set()
    assert meta["run_id"] == "exp" and meta["incarnation"]  # the fields written at creation survive too

"""metrics.jsonl after a crash mid-append: the torn tail is cut, never glued onto."""

from __future__ import annotations

import json
import logging

import pytest

from nip_core.parameters import HyperParameters
from nip_core.runs import RunStore
from nip_core.runs.storage import Storage


def params() -> HyperParameters:
    return HyperParameters.from_dict({"scenario": "graph_isomorphism", "trainer": "vanilla_ppo",
                                      "dataset": "test", "rl": {"num_iterations": 4}})


def row(iteration: int, loss: float) -> str:
    return json.dumps({"iteration": iteration, "kind": "train", "loss": loss}, sort_keys=True)


def torn_file(storage: Storage) -> None:
    """Two committed rows and the first half of a third (the crash cut it short)."""
    third = row(2, 0.25)
    storage.write_bytes("metrics.jsonl", (row(0, 1.0) + "\n" + row(1, 0.5) + "\n" + third[:len(third) // 2]).encode())


@pytest.fixture(params=["local", "memory"])
def run(request, tmp_path):
    base = str(tmp_path) if request.param == "local" else f"memory://torn-{tmp_path.name}"
    return RunStore(base).open_run("r", params())


def parsed_lines(run) -> list[dict]:
    text = run.storage.read_bytes("metrics.jsonl").decode()
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]  # raises on a glued/torn line


def test_append_line_cuts_the_torn_tail(run, caplog):
    torn_file(run.storage)
    with caplog.at_level(logging.WARNING, logger="nip_core.runs.storage"):
        run.storage.append_line("metrics.jsonl", row(2, 0.75))
    rows = parsed_lines(run)
    assert [r["iteration"] for r in rows] == [0, 1, 2]
    assert rows[2]["loss"] == 0.75  # the new row, not the torn remains
    assert any("metrics.jsonl" in r.getMessage() and "torn" in r.getMessage() for r in caplog.records)


def test_torn_iteration_is_appended_again(run):
    torn_file(run.storage)
    assert [r["iteration"] for r in run.read_metrics()] == [0, 1]  # the torn row is not committed
    assert not run.append_metrics(1, {"loss": 9.0})  # committed rows are still de-duplicated
    assert run.append_metrics(2, {"loss": 0.25})  # the resumed run writes iteration 2 again
    assert run.append_metrics(3, {"loss": 0.125})
    rows = parsed_lines(run)
    assert [r["iteration"] for r in rows] == [0, 1, 2, 3]
    assert run.read_metrics() == rows


def test_complete_row_without_newline_is_not_committed(run):
    """A row whose JSON is complete but whose newline is missing is torn too.

    read_metrics must not count it, otherwise append_metrics would skip the iteration
    while append_line cuts the row: the iteration would be lost.
    """
    run.storage.write_bytes("metrics.jsonl", (row(0, 1.0) + "\n" + row(1, 0.5)).encode())
    assert [r["iteration"] for r in run.read_metrics()] == [0]
    assert run.append_metrics(1, {"loss": 0.5})
    assert [r["iteration"] for r in parsed_lines(run)] == [0, 1]


def test_torn_only_line_and_clean_files(tmp_path):
    storage = Storage(tmp_path)
    storage.write_bytes("m.jsonl", b'{"iterat')  # the very first append was torn
    storage.append_line("m.jsonl", row(0, 1.0))
    assert storage.read_bytes("m.jsonl") == (row(0, 1.0) + "\n").encode()
    storage.append_line("m.jsonl", row(1, 0.5))  # a clean file is appended to as before
    assert storage.read_bytes("m.jsonl") == (row(0, 1.0) + "\n" + row(1, 0.5) + "\n").encode()


def test_torn_tail_longer_than_one_search_chunk(tmp_path, monkeypatch):
    """The backwards search for the last newline crosses chunk boundaries."""
    monkeypatch.setattr("nip_core.runs.storage._TAIL_CHUNK", 7)
    storage = Storage(tmp_path)
    storage.write_bytes("m.jsonl", (row(0, 1.0) + "\n" + "x" * 50).encode())
    storage.append_line("m.jsonl", row(1, 0.5))
    assert storage.read_bytes("m.jsonl") == (row(0, 1.0) + "\n" + row(1, 0.5) + "\n").encode()


def test_concurrent_appenders_never_cut_each_other(tmp_path):
    """Appenders in several processes: every line arrives whole (the tail check is locked)."""
    import subprocess
    import sys

    script = ("import sys\nfrom nip_core.runs.storage import Storage\n"
              "s = Storage(sys.argv[1])\n"
              "for i in range(200):\n    s.append_line('m.jsonl', '{\"p\": %s, \"i\": %d, \"pad\": \"%s\"}' "
              "% (sys.argv[2], i, 'x' * 3000))\n")
    procs = [subprocess.Popen([sys.executable, "-c", script, str(tmp_path), str(p)]) for p in range(3)]
    assert all(p.wait(timeout=120) == 0 for p in procs)
    rows = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert sorted((r["p"], r["i"]) for r in rows) == [(p, i) for p in range(3) for i in range(200)]

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from pydantic import BaseModel

from nip_core.errors import (
    CheckpointNotFoundError,
    CorruptCheckpointError,
    InvalidRunIdError,
    ParamsMismatchError,
    RunLockedError,
    RunNotFoundError,
)
from nip_core.parameters import HyperParameters
from nip_core.runs import RunStore
from nip_core.runs.lock import RunLock


class DemoState(BaseModel):
    iteration: int = 0
    stage: str = "start"


def params(**rl) -> HyperParameters:
    return HyperParameters.from_dict({"scenario": "graph_isomorphism", "trainer": "vanilla_ppo",
                                      "dataset": "test", "rl": rl})


def test_layout_and_metadata(tmp_path):
    run = RunStore(str(tmp_path)).open_run("exp1", params(num_iterations=3))
    root = tmp_path / "exp1"
    assert json.loads((root / "hyper_params.json").read_text()) == params(num_iterations=3).to_dict()
    meta = json.loads((root / "metadata.json").read_text())
    assert meta["params_hash"] == run.params_hash
    assert meta["package_name"] == "nipflow" and meta["created"] and meta["updated"]


def test_state_round_trip_and_errors(tmp_path):
    run = RunStore(str(tmp_path)).open_run("exp1", params())
    with pytest.raises(CheckpointNotFoundError, match="state.json"):
        run.load_state(DemoState)
    run.save_state(DemoState(iteration=2, stage="log_stats"))
    assert run.load_state(DemoState) == DemoState(iteration=2, stage="log_stats")
    (tmp_path / "exp1" / "state.json").write_text("{not json")
    with pytest.raises(CorruptCheckpointError, match="state.json"):
        run.load_state(DemoState)
    (tmp_path / "exp1" / "state.json").write_text('{"iteration": "many"}')
    with pytest.raises(CorruptCheckpointError, match="iteration"):
        run.load_state(DemoState)


def test_atomic_write_leaves_no_temp_files(tmp_path):
    run = RunStore(str(tmp_path)).open_run("exp1", params())
    for i in range(5):
        run.save_state(DemoState(iteration=i))
    # leases/ holds the lock file of metadata updates (leases/metadata.lock, Storage.locked)
    assert sorted(p.name for p in (tmp_path / "exp1").iterdir()) == ["hyper_params.json", "leases", "metadata.json",
                                                                     "state.json"]
    assert [p.name for p in (tmp_path / "exp1" / "leases").iterdir()] == ["metadata.lock"]


def test_params_mismatch_policies(tmp_path):
    store = RunStore(str(tmp_path))
    store.open_run("exp1", params(num_iterations=3))
    with pytest.raises(ParamsMismatchError) as info:
        store.open_run("exp1", params(num_iterations=4, lr=0.1))
    assert info.value.fields == ["rl.lr", "rl.num_iterations"]
    assert "rl.lr" in str(info.value) and "rl.num_iterations" in str(info.value)
    # nothing was overwritten by the refused open
    assert store.load_params("exp1").rl.num_iterations == 3
    run = store.open_run("exp1", params(num_iterations=4), on_params_mismatch="force")
    assert store.load_params("exp1").rl.num_iterations == 4
    assert run.metadata()["params_history"][0]["fields"] == ["rl.num_iterations"]
    # same params: no error, no history entry added
    store.open_run("exp1", params(num_iterations=4))
    assert len(run.metadata()["params_history"]) == 1


def test_resume_without_params_and_missing_run(tmp_path):
    store = RunStore(str(tmp_path))
    with pytest.raises(RunNotFoundError):
        store.open_run("ghost")
    store.open_run("exp1", params(num_iterations=9))
    assert store.open_run("exp1").params.rl.num_iterations == 9
    assert store.list_runs() == ["exp1"]


@pytest.mark.parametrize("bad", ["", "../x", "a/b", ".hidden", "x" * 200])
def test_run_id_validation(tmp_path, bad):
    with pytest.raises(InvalidRunIdError):
        RunStore(str(tmp_path)).open_run(bad, params())


def test_checkpoint_bytes_verified(tmp_path):
    store = RunStore(str(tmp_path))
    run = store.open_run("exp1", params())
    run.save_checkpoint_bytes("iter_000003", b"weights", iteration=3)
    data, manifest = run.load_checkpoint_bytes("iter_000003")
    assert data == b"weights" and manifest["iteration"] == 3
    assert run.list_checkpoints() == ["iter_000003"]
    (tmp_path / "exp1" / "checkpoints" / "iter_000003.pt").write_bytes(b"weightz")
    with pytest.raises(CorruptCheckpointError, match="sha256"):
        run.load_checkpoint_bytes("iter_000003")
    with pytest.raises(CheckpointNotFoundError):
        run.load_checkpoint_bytes("iter_000009")
    # a checkpoint written under other params is refused, not reused
    run.save_checkpoint_bytes("iter_000004", b"w4")
    other = store.open_run("exp1", params(lr=0.5), on_params_mismatch="force")
    with pytest.raises(CorruptCheckpointError, match="params hash"):
        other.load_checkpoint_bytes("iter_000004")


def test_metrics_never_duplicated(tmp_path):
    run = RunStore(str(tmp_path)).open_run("exp1", params())
    assert run.append_metrics(0, {"loss": 1.0})
    assert not run.append_metrics(0, {"loss": 2.0})
    assert run.append_metrics(0, {"kind": "test", "acc": 0.5})
    assert run.append_metrics(1, {"loss": 0.5})
    rows = run.read_metrics()
    assert [(r["iteration"], r["kind"]) for r in rows] == [(0, "train"), (0, "test"), (1, "train")]
    assert rows[0]["loss"] == 1.0


def test_run_lease_refuses_a_live_holder_and_takes_over_a_killed_one_once_expired(tmp_path):
    store = RunStore(str(tmp_path))
    store.open_run("exp1", params())
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys,time; from nip_core.runs import RunStore; from nip_core.runs.lock import RunLock;"
         f"r=RunStore({str(tmp_path)!r}).open_run('exp1'); r.lock = RunLock(r.storage, 'exp1', ttl_s=3.0);"
         "r.lock.acquire(); print('locked', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True, cwd=os.getcwd())
    try:
        assert holder.stdout.readline().strip() == "locked"
        run = store.open_run("exp1")
        run.lock = RunLock(run.storage, "exp1", ttl_s=1.5)
        with pytest.raises(RunLockedError) as info:
            run.lock.acquire(wait_s=4.5)  # 1.5 times its ttl: the live holder keeps renewing
        assert str(holder.pid) in str(info.value) and "expires_in_s" in str(info.value)
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        started = time.monotonic()
        run.lock.acquire(wait_s=10)  # the dead holder's claim expires; no pid or host is consulted
        assert run.lock.held and run.lock.generation == 2
        assert time.monotonic() - started < 8  # the claim expires within its 3 s ttl, long before the 10 s wait ends
        run.lock.release()
        assert run.lock.view().owner is None
    finally:
        holder.kill()


def test_fsspec_memory_store():
    store = RunStore("memory://nipflow-test-runs")
    run = store.open_run("exp1", params())
    run.save_state(DemoState(iteration=4))
    assert store.open_run("exp1").load_state(DemoState).iteration == 4
    assert run.append_metrics(0, {"x": 1}) and not run.append_metrics(0, {"x": 2})
    assert len(run.read_metrics()) == 1

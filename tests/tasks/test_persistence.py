"""Run-keyed cache policy, result storage and stale-lock takeover (no Prefect server)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "flows"))

from nip_core.experiment import make_params  # noqa: E402
from nip_core.settings import ExperimentSettings  # noqa: E402
from tasks.locks import StaleAwareLockManager  # noqa: E402
from tasks.persistence import (  # noqa: E402
    ResultStorageError,
    RunKeyPolicy,
    result_storage_for,
    run_cache_key,
    task_options_for,
)
from tasks.rl_block import plan_blocks  # noqa: E402
from tasks.stages import STAGE_TASKS, execute_stage, initial_position  # noqa: E402


@pytest.fixture
def text_trainer(tmp_path):
    import nipflow_fakes

    from nip_core.runs import RunStore

    params = make_params("code_validation", "pure_text_ei", overrides=["rl.num_iterations=2"])
    settings = ExperimentSettings(run_id="r.1", runs_dir=str(tmp_path / "runs"), use_wandb=False)
    run = RunStore(settings.runs_dir).open_run("r.1", params)
    return nipflow_fakes.FakeTextTrainer(params, settings, run=run)


def test_cache_key_has_no_dots_so_lock_files_cannot_collide():
    assert run_cache_key("gi.run", "abc123", "it3", "log_stats") == "gi_run--abc123--it3--log_stats"
    a = Path("/l").joinpath(run_cache_key("r", "h", "it0", "log_stats")).with_suffix(".lock")
    b = Path("/l").joinpath(run_cache_key("r", "h", "it0", "test")).with_suffix(".lock")
    assert a != b


def test_policy_key_is_run_params_and_position(text_trainer):
    policy = RunKeyPolicy(key_fn=lambda inputs: (f"it{inputs['iteration']}", "log_stats"))
    key = policy.compute_key(None, {"trainer": text_trainer, "iteration": 1}, {})
    assert key == f"r_1--{text_trainer.run.params_hash}--it1--log_stats"
    options = task_options_for(text_trainer, lambda inputs: ())
    assert options["result_storage"] == Path(text_trainer.run.storage.full("results"))
    assert options["cache_policy"].isolation_level.value == "SERIALIZABLE"
    assert result_storage_for(text_trainer.run) == options["result_storage"]


def test_policy_refuses_a_trainer_without_run(text_trainer):
    text_trainer.run = None
    with pytest.raises(ResultStorageError, match="FakeTextTrainer has no run"):
        RunKeyPolicy().compute_key(None, {"trainer": text_trainer}, {})


def test_plan_blocks_covers_every_iteration_once():
    assert [(b.index, b.start, b.stop) for b in plan_blocks(7, 3)] == [(0, 0, 3), (1, 3, 6), (2, 6, 7)]
    assert plan_blocks(0, 3) == []
    with pytest.raises(ValueError, match="block_size"):
        plan_blocks(4, 0)


def test_stage_tasks_and_run_names():
    assert list(STAGE_TASKS) == ["sample_rollouts", "log_stats", "test_during_training",
                                 "create_fine_tune_jobs", "await_fine_tune_jobs", "test"]
    assert STAGE_TASKS["log_stats"].task_run_name == "log_stats[it={iteration}]"


def test_execute_stage_runs_then_recovers_a_done_stage_from_the_state(text_trainer):
    assert initial_position(text_trainer) == (0, "sample_rollouts")
    summary = execute_stage(text_trainer, "sample_rollouts", 0)
    assert (summary["next_iteration"], summary["next_stage"]) == (0, "log_stats")
    # As after a crash between the state write and the result write: not executed again.
    again = execute_stage(text_trainer, "sample_rollouts", 0)
    assert again == {"iteration": 0, "stage": "sample_rollouts", "next_iteration": 0,
                     "next_stage": "log_stats", "recovered_from_state": True}
    import nipflow_fakes

    starts = [e for e in nipflow_fakes.executions(text_trainer.run.storage.full("")) if e["event"] == "start"]
    assert len(starts) == 1


def test_lock_of_a_dead_process_is_taken_over(tmp_path):
    manager = StaleAwareLockManager(lock_files_directory=tmp_path)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert manager.acquire_lock("k", holder="me")
    owner = tmp_path / "k.lock.owner"
    owner.write_text(owner.read_text().replace(f'"pid": {os.getpid()}', f'"pid": {dead.pid}'))
    other = StaleAwareLockManager(lock_files_directory=tmp_path)
    assert other.is_locked("k") is False
    assert not (tmp_path / "k.lock").exists()
    assert other.acquire_lock("k", holder="other", acquire_timeout=1)
    assert other.is_lock_holder("k", "other")


def test_lock_of_a_live_process_is_respected(tmp_path):
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        manager = StaleAwareLockManager(lock_files_directory=tmp_path)
        assert manager.acquire_lock("k", holder="me")
        owner = tmp_path / "k.lock.owner"
        owner.write_text(owner.read_text().replace(f'"pid": {os.getpid()}', f'"pid": {live.pid}'))
        other = StaleAwareLockManager(lock_files_directory=tmp_path)
        assert other.is_locked("k") is True
        assert other.acquire_lock("k", holder="other", acquire_timeout=0.3) is False
    finally:
        live.kill()
        live.wait()

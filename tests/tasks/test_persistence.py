"""Run-keyed cache policy, result storage and expiring stage locks (no Prefect server)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "flows"))

from nip_core.experiment import make_params  # noqa: E402
from nip_core.settings import ExperimentSettings  # noqa: E402
from nip_core.runs.storage import Storage  # noqa: E402
from tasks.locks import LeaseLockManager  # noqa: E402
from tasks.persistence import (  # noqa: E402
    ResultStorageError,
    RunKeyPolicy,
    result_storage_for,
    run_cache_key,
    run_storage_of,
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
    return nipflow_fakes.FakeTextTrainer(params, settings=settings, run=run)


def test_cache_key_has_no_dots_so_lock_files_cannot_collide():
    assert run_cache_key("gi.run", "abc123", "it3", "log_stats") == "gi_run--abc123--it3--log_stats"
    a = Path("/l").joinpath(run_cache_key("r", "h", "it0", "log_stats")).with_suffix(".lock")
    b = Path("/l").joinpath(run_cache_key("r", "h", "it0", "test")).with_suffix(".lock")
    assert a != b


def _spec(trainer):
    from flows.parameters import RunSpec

    return RunSpec.of(trainer.hyper_params, trainer.settings)


def test_policy_key_is_run_params_and_position(text_trainer):
    spec = _spec(text_trainer)
    options = task_options_for(spec, lambda inputs: (f"it{inputs['iteration']}", "log_stats"))
    policy = options["cache_policy"]
    key = policy.compute_key(None, {"spec": spec, "iteration": 1}, {})
    assert key == f"r_1--{text_trainer.run.params_hash}--it1--log_stats"
    assert options["result_storage"] == Path(text_trainer.run.storage.full("results"))
    assert policy.isolation_level.value == "SERIALIZABLE"
    assert result_storage_for(text_trainer.run.storage) == options["result_storage"]
    assert run_storage_of(spec).full("") == text_trainer.run.storage.full("")


def test_policy_refuses_a_spec_without_run(text_trainer):
    spec = _spec(text_trainer)
    for settings in ({**spec.settings, "run_id": None}, {**spec.settings, "test_run": True}):
        with pytest.raises(ResultStorageError, match="need a run in the run store"):
            task_options_for(spec.model_copy(update={"settings": settings}), lambda inputs: ())
    with pytest.raises(ResultStorageError, match="needs the run_id and params_hash"):
        RunKeyPolicy().compute_key(None, {"spec": spec}, {})


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


def test_stage_lock_of_a_killed_holder_is_taken_over_once_expired(tmp_path):
    """A holder SIGKILLed inside a transaction leaves a lease that expires (no pid reasoning)."""
    storage = Storage(str(tmp_path))
    code = ("import sys, os, signal; from nip_core.runs.storage import Storage; from tasks.locks import "
            f"LeaseLockManager; m = LeaseLockManager(Storage({str(tmp_path)!r}), ttl_s=1.0); "
            "assert m.acquire_lock('k', holder='dead'); print('held', flush=True); os.kill(os.getpid(), signal.SIGKILL)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert proc.stdout.strip() == "held" and proc.returncode == -9
    other = LeaseLockManager(storage, ttl_s=1.0)
    assert other.is_locked("k") is True  # not expired yet: respected although its holder is dead
    assert other.acquire_lock("k", holder="other", acquire_timeout=0.2) is False
    assert other.acquire_lock("k", holder="other", acquire_timeout=5)  # taken over after the ttl
    assert other.is_lock_holder("k", "other") and not other.is_lock_holder("k", "dead")
    other.release_lock("k", "other")
    assert other.is_locked("k") is False


def test_stage_lock_of_a_live_holder_is_respected_and_renewed(tmp_path):
    storage = Storage(str(tmp_path))
    holder = LeaseLockManager(storage, ttl_s=1.5)  # renewal window 1 s: room for a thread starved of CPU
    assert holder.acquire_lock("k", holder="me")
    other = LeaseLockManager(storage, ttl_s=1.5)
    # kept alive well past its ttl by the renewal thread
    assert other.acquire_lock("k", holder="other", acquire_timeout=3.5) is False
    assert holder.is_lock_holder("k", "me")
    holder.release_lock("k", "me")
    assert other.acquire_lock("k", holder="other", acquire_timeout=0.5)


@pytest.mark.parametrize("content", [b"", b'{"owner": "x", "expi'])
def test_an_empty_or_torn_stage_lock_counts_as_free(tmp_path, content):
    storage = Storage(str(tmp_path))
    storage.write_bytes("leases/stages/k/0000000001.json", content)
    manager = LeaseLockManager(storage, ttl_s=30)
    assert manager.is_locked("k") is False
    assert manager.acquire_lock("k", holder="me", acquire_timeout=0.5)
    assert manager.is_lock_holder("k", "me")

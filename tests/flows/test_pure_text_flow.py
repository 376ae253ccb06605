"""The pure-text flow: stage caching across flow runs, crash/resume, a two-process race."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from nip_core.runs.fencing import logical_names
from nip_core.runs.storage import Storage
from tests.run_files import run_file

HERE = Path(__file__).resolve().parent
PYTHON = sys.executable

STAGES_PER_RUN_2_ITERATIONS = 2 * 5 + 1  # five stages per iteration, then test


def _params(tmp_path, run_id, **extra):
    from flows.parameters import ExperimentParameters

    return ExperimentParameters(scenario="code_validation", trainer="pure_text_ei", run_id=run_id,
                                runs_dir=str(tmp_path / "runs"), overrides=["rl.num_iterations=2"],
                                wait_mode="poll", **extra)


def _task_runs(flow_run_id, expected=STAGES_PER_RUN_2_ITERATIONS):
    """Task run name -> final state name (the server records task runs asynchronously)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    deadline = time.monotonic() + 30
    with get_client(sync_client=True) as client:
        while True:
            runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
            names = {r.name: r.state.name for r in runs if r.state is not None and r.state.is_final()}
            if len(names) >= expected or time.monotonic() > deadline:
                return names
            time.sleep(0.2)


def _ends(fakes, run_dir):
    return Counter((e["iteration"], e["stage"]) for e in fakes.executions(run_dir) if e["event"] == "end")


def test_new_flow_run_reuses_completed_stages(fakes, tmp_path):
    from flows.experiment import train_experiment

    params = _params(tmp_path, "text-cache")
    first = train_experiment(**params.flow_parameters(), return_state=True)
    assert first.is_completed(), first.message
    run_dir = tmp_path / "runs" / "text-cache"
    ends = _ends(fakes, run_dir)
    assert len(ends) == STAGES_PER_RUN_2_ITERATIONS and set(ends.values()) == {1}
    assert first.result()["iteration"] == 2

    second = train_experiment(**params.flow_parameters(), return_state=True)
    assert second.is_completed()
    assert _ends(fakes, run_dir) == ends  # nothing executed again
    names = _task_runs(second.state_details.flow_run_id)
    assert names["sample_rollouts[it=1]"] == "Cached"
    assert names["test[it=2]"] == "Cached"
    assert set(names.values()) == {"Cached"}
    assert len(names) == STAGES_PER_RUN_2_ITERATIONS
    # one fine-tune job record per iteration, and the summary artifact names the run store
    assert logical_names(Storage(str(run_dir)), "fine_tune") == ["job-0.json", "job-1.json"]
    assert len(list((run_dir / "results").iterdir())) == STAGES_PER_RUN_2_ITERATIONS


def _start_child(params, env, **fake_env):
    return subprocess.Popen([PYTHON, str(HERE / "run_fake_experiment.py"), params.model_dump_json()],
                            env={**env, **fake_env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _wait_for(predicate, proc, timeout=90):
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"child exited early ({proc.returncode}): {proc.stdout.read().decode()[-3000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("child did not reach the expected point")
        time.sleep(0.1)


@pytest.mark.slow
def test_sigkill_inside_a_stage_then_resume(fakes, tmp_path, subprocess_env):
    """Killed inside create_fine_tune_jobs of iteration 1; a new flow run finishes the run."""
    from flows.experiment import train_experiment

    params = _params(tmp_path, "text-crash")
    run_dir = tmp_path / "runs" / "text-crash"
    child = _start_child(params, subprocess_env, FAKE_SLEEP_AT="1:create_fine_tune_jobs", FAKE_SLEEP_S="120")
    started = lambda: any(e["event"] == "start" and (e["iteration"], e["stage"]) == (1, "create_fine_tune_jobs")  # noqa: E731
                          for e in fakes.executions(run_dir))
    _wait_for(started, child)
    child.send_signal(signal.SIGKILL)
    child.wait()

    resumed = train_experiment(**params.flow_parameters(), return_state=True)
    assert resumed.is_completed(), resumed.message
    ends = _ends(fakes, run_dir)
    assert len(ends) == STAGES_PER_RUN_2_ITERATIONS and set(ends.values()) == {1}
    starts = Counter((e["iteration"], e["stage"]) for e in fakes.executions(run_dir) if e["event"] == "start")
    assert starts[(1, "create_fine_tune_jobs")] == 2  # the killed one, and its re-run
    assert sum(starts.values()) == STAGES_PER_RUN_2_ITERATIONS + 1
    names = _task_runs(resumed.state_details.flow_run_id)
    assert names["sample_rollouts[it=0]"] == names["await_fine_tune_jobs[it=0]"] == "Cached"
    assert names["test_during_training[it=1]"] == "Cached"
    assert names["create_fine_tune_jobs[it=1]"] == "Completed"
    assert names["test[it=2]"] == "Completed"
    assert logical_names(Storage(str(run_dir)), "fine_tune") == ["job-0.json", "job-1.json"]

    # the final state equals an uninterrupted run's
    from nip_core.trainers import build_trainer

    ref_params = _params(tmp_path, "text-reference")
    hp = ref_params.hyper_params()
    build_trainer(hp, ref_params.settings(hp)).train()  # uninterrupted, without Prefect
    ref_state = (tmp_path / "runs" / "text-reference" / "state.json").read_text()
    assert run_file(run_dir, "state.json").read_text() == ref_state


@pytest.mark.long(75)
@pytest.mark.slow
def test_two_processes_racing_execute_each_stage_once(fakes, tmp_path, subprocess_env, monkeypatch):
    from flows.experiment import train_experiment

    params = _params(tmp_path, "text-race")
    run_dir = tmp_path / "runs" / "text-race"
    child = _start_child(params, subprocess_env, FAKE_SLEEP_AT="0:log_stats", FAKE_SLEEP_S="3")
    started = lambda: any(e["event"] == "start" and e["stage"] == "log_stats" for e in fakes.executions(run_dir))  # noqa: E731
    _wait_for(started, child)
    # The racer waits for the child's lease for 1.5 of its own ttl: long enough for the child
    # to finish its run on a loaded machine (the child's claims keep the tests' 5 s ttl).
    monkeypatch.setenv("NIPFLOW_LEASE_TTL_S", "60")
    here = train_experiment(**params.flow_parameters(), return_state=True)  # races the child from log_stats on
    assert child.wait(timeout=120) == 0, child.stdout.read().decode()[-3000:]
    assert here.is_completed()
    starts = Counter((e["iteration"], e["stage"]) for e in fakes.executions(run_dir) if e["event"] == "start")
    assert len(starts) == STAGES_PER_RUN_2_ITERATIONS and set(starts.values()) == {1}
    assert _task_runs(here.state_details.flow_run_id)["log_stats[it=0]"] == "Cached"

"""Deployed fine-tune wait: the run suspends (no process left), the watcher resumes it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def _execute_flow_run(flow_run_id, env) -> int:
    """Run a flow run the way a process worker does (``python -m prefect.engine``)."""
    proc = subprocess.run([sys.executable, "-m", "prefect.engine"], cwd=REPO,
                          env={**env, "PREFECT__FLOW_RUN_ID": str(flow_run_id)},
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=180)
    return proc.returncode, proc.stdout.decode()[-3000:]


def _state(flow_run_id):
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(flow_run_id).state


@pytest.mark.e2e
def test_suspended_run_is_resumed_by_the_watcher(fakes, tmp_path, subprocess_env, monkeypatch):
    from prefect.deployments import run_deployment
    from prefect.flows import load_flow_from_entrypoint

    from flows.parameters import ExperimentParameters
    from flows.watcher import fine_tune_watcher

    flow = load_flow_from_entrypoint(str(HERE / "fake_entry.py") + ":train_experiment")
    deployment = flow.to_deployment(name="suspend-test")
    deployment.entrypoint = "tests/flows/fake_entry.py:train_experiment"
    deployment.apply()
    params = ExperimentParameters(scenario="code_validation", trainer="pure_text_ei", run_id="cv-suspend",
                                  runs_dir=str(tmp_path / "runs"), overrides=["rl.num_iterations=1"],
                                  wait_mode="auto")
    flow_run = run_deployment("train_experiment/suspend-test", parameters=params.flow_parameters(mode="json"),
                              timeout=0)
    env = {**subprocess_env, "FAKE_JOB_GATE": "1"}
    monkeypatch.setenv("FAKE_JOB_GATE", "1")  # for the watcher, which runs here

    rc, out = _execute_flow_run(flow_run.id, env)
    state = _state(flow_run.id)
    assert state.name == "Suspended", out  # the process has exited; nothing holds the wait
    assert fine_tune_watcher() == []  # the job is still running: not resumed
    run_dir = tmp_path / "runs" / "cv-suspend"
    (run_dir / "fine_tune" / "release-0").write_text("done")
    # a tick that starts late (a backlog after an outage) does nothing, even with work to do
    assert fine_tune_watcher(max_lateness_s=1e-6) == [] and _state(flow_run.id).name == "Suspended"
    assert fine_tune_watcher() == [str(flow_run.id)]
    assert _state(flow_run.id).is_scheduled()
    assert fine_tune_watcher() == []  # an overlapping tick finds nothing to resume: no error

    rc, out = _execute_flow_run(flow_run.id, env)
    assert _state(flow_run.id).is_completed(), out
    starts = Counter((e["iteration"], e["stage"]) for e in fakes.executions(run_dir) if e["event"] == "start")
    assert set(starts.values()) == {1} and len(starts) == 6
    assert sorted(os.listdir(run_dir / "fine_tune")) == ["job-0.json", "release-0"]
    assert (run_dir / "orchestration" / "suspensions.json").read_text().count('"0": 1') == 1


def _entrypoint_modules() -> list[str]:
    import yaml

    spec = yaml.safe_load((REPO / "deployments" / "prefect.yaml").read_text())
    return sorted({d["entrypoint"].rsplit(".", 1)[0] for d in spec["deployments"]})


def test_every_deployment_entrypoint_loads_without_the_torch_stack():
    # A flow-run process loads its flow before it starts sending heartbeats; the watcher runs a
    # new process per tick. Loading the flow must not pay for torch, the trainers or the OpenAI
    # client (seconds of CPU): they are imported once a flow run builds a trainer.
    modules = _entrypoint_modules()
    assert {"flows.experiment", "flows.rl_blocks", "flows.sweep", "flows.watcher", "flows.retrain"} <= set(modules)
    code = (f"import importlib, sys\nfor name in {modules!r}:\n    importlib.import_module(name)\n"
            "print(sorted(m for m in ('torch', 'torchrl', 'tensordict', 'transformers', 'openai') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"

"""The TensorDict flow: GPU-tagged block flow runs, retried after a fault, cached per block."""

from __future__ import annotations

import json
import time
from collections import Counter


def _params(tmp_path, run_id):
    from flows.parameters import ExperimentParameters

    return ExperimentParameters(scenario="graph_isomorphism", trainer="vanilla_ppo", run_id=run_id,
                                runs_dir=str(tmp_path / "runs"), overrides=["rl.num_iterations=6"],
                                block_size=2)


def _final_w(run_dir):
    """The iteration and weight of the fake trainer's newest checkpoint (``upto_<stop>``)."""
    manifest = json.loads(max((run_dir / "checkpoints").glob("upto_*.json")).read_text())
    return manifest["iteration"], json.loads((run_dir / "checkpoints" / manifest["data"]).read_text())["w"]


def _train_directly(parameters):
    """The uninterrupted reference: ``Trainer.train()`` in-process, without Prefect."""
    from nip_core.trainers import build_trainer

    hp = parameters.hyper_params()
    build_trainer(hp, parameters.settings(hp)).train()


def _block_runs(parent_id):
    """(name, run_count, state, tags) of the block flow runs under ``parent_id``."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    with get_client(sync_client=True) as client:
        deadline = time.monotonic() + 20
        while True:
            runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[parent_id])))
            if all(r.state and r.state.is_final() for r in runs) or time.monotonic() > deadline:
                return sorted((r.name, r.run_count, r.state.name, tuple(r.tags)) for r in runs)
            time.sleep(0.2)


def _train_task_tags(root_id):
    """Tags of every ``train_iterations`` task run of the flow run tree under ``root_id``."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId, TaskRunFilter, \
        TaskRunFilterName

    with get_client(sync_client=True) as client:
        children = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[root_id])))
        runs = [t for c in children for t in client.read_task_runs(
            flow_run_filter=FlowRunFilter(id={"any_": [c.id]}),
            task_run_filter=TaskRunFilter(name=TaskRunFilterName(like_="train_iterations")))]
    assert runs
    return {tuple(sorted(t.tags)) for t in runs}


def test_block_fault_is_retried_and_ends_like_an_uninterrupted_run(fakes, tmp_path, monkeypatch):
    from flows.experiment import train_experiment

    _train_directly(_params(tmp_path, "rl-reference"))

    monkeypatch.setenv("FAKE_FAULT_START", "2")  # the second block fails once, midway
    faulty = train_experiment(**_params(tmp_path, "rl-faulty").flow_parameters(), return_state=True)
    assert faulty.is_completed(), faulty.message
    run_dir = tmp_path / "runs" / "rl-faulty"
    assert (run_dir / "fault-2.done").exists()
    assert _final_w(run_dir) == _final_w(tmp_path / "runs" / "rl-reference")
    assert _final_w(run_dir)[0] == 6
    starts = Counter(e["start"] for e in fakes.executions(run_dir) if e["event"] == "start")
    assert starts == {0: 1, 2: 2, 4: 1}
    blocks = _block_runs(faulty.state_details.flow_run_id)
    assert [(name, count, state) for name, count, state, _ in blocks] == [
        ("rl-block-0[0:2]", 1, "Completed"), ("rl-block-1[2:4]", 2, "Completed"),
        ("rl-block-2[4:6]", 1, "Completed")]
    assert all("gpu" in tags for *_, tags in blocks)
    assert _train_task_tags(faulty.state_details.flow_run_id) == {("gpu",)}

    # a new flow run of the same run: every block comes back from the cache
    again = train_experiment(**_params(tmp_path, "rl-faulty").flow_parameters(), return_state=True)
    assert again.is_completed()
    assert Counter(e["start"] for e in fakes.executions(run_dir) if e["event"] == "start") == starts
    assert again.result()["iteration"] == 6

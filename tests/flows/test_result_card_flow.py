"""The result card at the end of a run, and what the parent flow run of an experiment carries.

A real tiny GI vanilla_ppo run of 4 iterations in blocks of 2: the parent flow run has one
progress artifact, one metrics table whose latest version holds all 4 iterations, and
the result card (4/4); the block flow runs only have block-scoped tables. The same holds
when every block trains with its own trainer object (as on a deployed worker), where the
parent's trainer never sees the iterations. ``nipflow run``/``resume`` print the card
(``--json``: only the card, as JSON), also when the run is preempted.
"""

from __future__ import annotations

import json
import os
import signal

import pytest

from nip_core.parameters.agents import GraphIsomorphismAgentParameters

TINY = GraphIsomorphismAgentParameters.construct_test_params().model_dump()
RL = dict(frames_per_batch=16, num_iterations=4, num_epochs=1, minibatch_size=8, num_test_iterations=1,
          num_normalization_steps=3)


def _parameters(tmp_path, run_id, **kw):
    from flows.parameters import ExperimentParameters

    return ExperimentParameters(
        scenario="graph_isomorphism", trainer="vanilla_ppo", protocol="nip", dataset="test", run_id=run_id,
        params={"d_representation": 2, "agents": {"_default": TINY}, "rl": RL},
        runs_dir=str(tmp_path / "runs"), block_size=2, settings_overrides={"data_dir": str(tmp_path / "data")},
        **kw)


def _artifacts(flow_run_id) -> list:
    """Every keyed artifact version created in ``flow_run_id`` (its tasks included), oldest first."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
    return sorted((a for a in found if a.key is not None), key=lambda a: a.created)


def _children(flow_run_id) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flow_run_id])))
    return sorted(runs, key=lambda r: r.name)


def _table(artifact) -> list[dict]:
    return json.loads(artifact.data) if isinstance(artifact.data, str) else artifact.data


def _check_parent_and_blocks(state, run_id, runs_dir):
    from nip_core.logging.result_card import result_card
    from nip_core.runs import RunStore

    parent = state.state_details.flow_run_id
    artifacts = _artifacts(parent)
    assert {a.key for a in artifacts} == {f"{run_id}-progress", f"{run_id}-metrics", f"{run_id}-result-card",
                                          f"{run_id}-summary"}
    progress = [a for a in artifacts if a.key == f"{run_id}-progress"]
    assert len(progress) == 1 and float(progress[0].data) == 100.0
    tables = [_table(a) for a in artifacts if a.key == f"{run_id}-metrics"]
    # a new version at the end of each block, each with every iteration so far (read from the
    # run store); where iterations take longer than the hooks' min_interval_s (a loaded
    # machine), also versions in between: every version is the table so far, and it grows
    versions = [[row["iteration"] for row in t] for t in tables]
    assert [0, 1] in versions and versions[-1] == [0, 1, 2, 3], versions
    assert all(v == list(range(len(v))) for v in versions), versions
    assert [len(v) for v in versions] == sorted({len(v) for v in versions}), versions
    stored = [r for r in RunStore(runs_dir).open_run(run_id).read_metrics() if r["kind"] == "train"]
    assert [row["mean_accuracy"] for row in tables[-1]] == [r["mean_accuracy"] for r in stored]

    cards = [a for a in artifacts if a.key == f"{run_id}-result-card"]
    assert len(cards) == 1
    md = cards[0].data
    assert md.splitlines()[0] == f"# Result card: {run_id}"
    assert "| iterations | 4/4 |" in md and "| status | completed |" in md
    assert f"`{run_id}-block-0-metrics`" in md and "rl-block-1[2:4]" in md
    summary = next(a for a in artifacts if a.key == f"{run_id}-summary")
    assert f"`{run_id}-result-card`" in summary.data and "4/4 iterations" in summary.data

    blocks = [c for c in _children(parent) if c.name.startswith("rl-block")]
    assert [b.name for b in blocks] == ["rl-block-0[0:2]", "rl-block-1[2:4]"]
    for index, block in enumerate(blocks):
        own = _artifacts(block.id)
        assert {a.key for a in own} == {f"{run_id}-block-{index}-metrics"}  # nothing under the parent's keys
        assert [row["iteration"] for row in _table(own[-1])] == [2 * index, 2 * index + 1]

    card = result_card(RunStore(runs_dir).open_run(run_id))
    assert (card.iterations_done, card.status, card.flow_run_id) == (4, "completed", str(parent))
    assert card.final_train_accuracy == stored[-1]["mean_accuracy"]


@pytest.mark.slow
def test_parent_flow_run_carries_one_progress_one_full_table_and_the_card(prefect_server, tmp_path):
    import torch

    from flows.experiment import train_experiment

    torch.set_num_threads(1)
    state = train_experiment(**_parameters(tmp_path, "card-gi").flow_parameters(), return_state=True)
    assert state.is_completed(), state.message
    assert state.result()["iteration"] == 4
    _check_parent_and_blocks(state, "card-gi", str(tmp_path / "runs"))


@pytest.mark.slow
def test_blocks_trained_by_other_trainer_objects_still_give_4_of_4(prefect_server, tmp_path, monkeypatch):
    """As on deployed workers: each block builds (and keeps) its own trainer; the parent's never trains."""
    import torch

    import flows.experiment as experiment
    import flows.rl_blocks as rl_blocks
    import flows.trainer_access as trainer_access
    from tasks.trainers import forget_trainer, keep_trainer

    torch.set_num_threads(1)
    built = []

    def fresh_trainer(spec):
        forget_trainer(spec)  # a worker's process has no trainer of the parent's
        trainer = trainer_access.build_flow_trainer(spec.hyper_params(), spec.experiment_settings())
        keep_trainer(spec, trainer)  # what trainer_from_spec does: the block's tasks use this one
        built.append(trainer)
        return trainer

    monkeypatch.setattr(rl_blocks, "trainer_from_spec", fresh_trainer)
    state = experiment.train_experiment(**_parameters(tmp_path, "card-fresh").flow_parameters(), return_state=True)
    assert state.is_completed(), state.message
    assert len(built) == 2
    _check_parent_and_blocks(state, "card-fresh", str(tmp_path / "runs"))


def _cli_args(tmp_path, run_id):
    params = tmp_path / "p.json"
    params.write_text(json.dumps({"d_representation": 2, "agents": {"_default": TINY},
                                  "rl": {**RL, "num_iterations": 3}}))
    return ["run", "graph_isomorphism", "vanilla_ppo", "--protocol", "nip", "--dataset", "test", "--params",
            str(params), "--run-id", run_id, "--runs-dir", str(tmp_path / "runs"), "--no-wandb", "--progress", "off"]


@pytest.mark.slow
def test_cli_json_card_then_resume_prints_the_card_before_the_run_id(tmp_path, capsys):
    import torch

    from flows.cli import main
    from nip_core.runs import RunStore

    torch.set_num_threads(1)
    assert main([*_cli_args(tmp_path, "cli-card"), "--direct", "--json"]) == 0
    out = capsys.readouterr().out
    card = json.loads(out)  # nothing else on stdout
    rows = RunStore(str(tmp_path / "runs")).open_run("cli-card").read_metrics()
    train, test = [r for r in rows if r["kind"] == "train"], [r for r in rows if r["kind"] == "test"]
    assert (card["run_id"], card["status"], card["iterations_done"], card["iterations_planned"]) == (
        "cli-card", "completed", 3, 3)
    assert card["final_train_accuracy"] == train[-1]["mean_accuracy"]
    assert card["final_test_accuracy"] == test[-1]["test_mean_accuracy"]
    assert (card["invocations"], card["prefect_ui"], card["wandb"]) == (1, None, None)
    assert card["wall_time_s"] > 0 and card["run_store"] == str(tmp_path / "runs" / "cli-card")

    assert main(["resume", "cli-card", "--runs-dir", str(tmp_path / "runs"), "--direct", "--no-wandb"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "cli-card"  # scripts read the run id from the last line
    assert lines[0].startswith("── Result card: cli-card ")
    assert "iterations      3/3" in lines and "status          completed" in lines
    assert any(line.startswith("wall time ") and "(2 invocation(s))" in line for line in lines)


@pytest.mark.slow
def test_cli_prints_the_card_of_a_preempted_run_and_exits_75(tmp_path, capsys, monkeypatch):
    import torch

    from flows.cli import main
    from nip_core.trainers.preemption import PREEMPTED_EXIT_CODE
    from nip_core.trainers.tensordict_rl import TensorDictRlTrainer

    torch.set_num_threads(1)
    inner = TensorDictRlTrainer._train_iteration

    def preempted_at_1(self, iteration):
        if iteration == 1:
            os.kill(os.getpid(), signal.SIGTERM)  # stops after the current minibatch step
        return inner(self, iteration)

    monkeypatch.setattr(TensorDictRlTrainer, "_train_iteration", preempted_at_1)
    assert main([*_cli_args(tmp_path, "cli-pre"), "--direct", "--json"]) == PREEMPTED_EXIT_CODE
    card = json.loads(capsys.readouterr().out)
    assert (card["status"], card["iterations_done"], card["iterations_planned"]) == ("preempted", 1, 3)
    assert card["message"].startswith("training preempted by SIGTERM: checkpoint of iteration 1")


def test_cli_through_prefect_json_card_names_the_flow_run(fakes, tmp_path, capsys):
    from prefect.settings import PREFECT_UI_URL

    from flows.cli import main

    code = main(["run", "graph_isomorphism", "vanilla_ppo", "--run-id", "cli-flow", "--runs-dir",
                 str(tmp_path / "runs"), "--no-wandb", "--set", "rl.num_iterations=3", "--json"])
    assert code == 0
    card = json.loads(capsys.readouterr().out)
    assert (card["status"], card["iterations_done"], card["iterations_planned"], card["invocations"]) == (
        "completed", 3, 3, 1)
    assert card["flow_run_id"]
    ui = PREFECT_UI_URL.value()
    assert card["prefect_ui"] == (f"{ui.rstrip('/')}/runs/flow-run/{card['flow_run_id']}" if ui else None)
    keys = {a.key for a in _artifacts(card["flow_run_id"])}
    assert {"cli-flow-result-card", "cli-flow-metrics", "cli-flow-progress"} <= keys


def test_cli_through_prefect_prints_the_card_of_a_failed_run(fakes, tmp_path, capsys, monkeypatch):
    from flows.cli import main

    def broken(self, start, stop):
        raise RuntimeError(f"broken block [{start}:{stop})")

    monkeypatch.setattr(fakes.FakeRlTrainer, "run_iterations", broken)
    code = main(["run", "graph_isomorphism", "vanilla_ppo", "--run-id", "cli-fail", "--runs-dir",
                 str(tmp_path / "runs"), "--no-wandb", "--set", "rl.num_iterations=2"])
    assert code == 2  # FlowRunFailedError: the existing status
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("── Result card: cli-fail ")
    status = next(line for line in out if line.startswith("status "))
    assert status.startswith("status          failed: ") and "broken block [0:2)" in status
    assert "iterations      0/2" in out
    assert out[-1] != "cli-fail"  # no run id line: the run did not complete

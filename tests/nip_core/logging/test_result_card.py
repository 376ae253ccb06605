"""The result card, built from the run store alone: a real tiny GI run and a text run fixture."""

from __future__ import annotations

import json

import pytest

from nip_core.logging.result_card import result_card
from nip_core.runs.invocations import begin_invocation, end_invocation, invocation_count, latest_invocation
from nip_core.parameters import HyperParameters
from nip_core.runs import RunStore
from tests.nip_core.trainers.gi_helpers import make_trainer, tiny_params


@pytest.fixture(scope="module")
def gi_run(tmp_path_factory):
    """A tiny vanilla_ppo GI run of 4 iterations trained in-process, one recorded invocation."""
    import torch

    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("gi")
    trainer = make_trainer(tiny_params(rl=dict(num_iterations=4)), tmp, run_id="gi-card")
    index = begin_invocation(trainer.run, "direct")
    trainer.train()
    end_invocation(trainer.run, index, "completed")
    trainer.close()
    return RunStore(str(tmp)).open_run("gi-card"), tmp


def test_card_of_a_real_gi_run_matches_the_run_store(gi_run):
    run, tmp = gi_run
    card = result_card(run)
    rows = run.read_metrics()
    train = [r for r in rows if r["kind"] == "train"]
    test = [r for r in rows if r["kind"] == "test"]
    assert (card.run_id, card.status, card.scenario, card.trainer, card.protocol, card.dataset) == (
        "gi-card", "completed", "graph_isomorphism", "vanilla_ppo", "nip", "test")
    assert (card.iterations_done, card.iterations_planned) == (4, 4)
    assert len(train) == 4 and len(test) == 1
    assert (card.final_train_accuracy, card.final_train_iteration) == (train[-1]["mean_decided_accuracy"], 3)
    assert (card.final_test_accuracy, card.final_test_iteration) == (test[-1]["test_mean_decided_accuracy"], 4)
    assert card.text_run is False and card.fine_tune_jobs is None and card.trained_tokens is None
    assert card.precision == "fp32 (rl.precision)"
    assert card.run_store == str(tmp / "gi-card")
    assert card.report == str(tmp / "gi-card" / "report" / "summary.md") and card.report_written is False
    assert card.report_command == f"nipflow report gi-card --runs-dir {tmp}"
    assert card.wandb is None and card.prefect_ui is None  # no W&B, no Prefect (direct)
    inv = latest_invocation(run)
    assert inv["driver"] == "direct" and inv["status"] == "completed"
    assert card.invocations == 1 and card.started == inv["started"] and card.ended == inv["ended"]
    assert card.wall_time_s is not None and card.wall_time_s > 0 and card.total_wall_time_s == card.wall_time_s


def test_card_renders_as_markdown_text_and_json(gi_run):
    run, _ = gi_run
    card = result_card(run)
    md = card.to_markdown()
    assert md.splitlines()[0] == "# Result card: gi-card"
    assert "| iterations | 4/4 |" in md
    assert "| precision | fp32 (rl.precision) |" in md
    assert f"| train accuracy | {card.final_train_accuracy:.4f} (iteration 3) |" in md
    text = card.to_text().splitlines()
    assert text[0].startswith("── Result card: gi-card ")
    assert "iterations      4/4" in text
    assert "Prefect UI      none (run with --direct)" in text
    data = json.loads(card.to_json())
    assert data == card.to_dict()
    assert (data["iterations_done"], data["status"], data["final_test_accuracy"]) == (
        4, "completed", card.final_test_accuracy)


def test_status_and_message_given_by_the_caller_win(gi_run):
    run, _ = gi_run
    card = result_card(run, status="failed", message="FlowRunFailedError: boom")
    assert (card.status, card.message) == ("failed", "FlowRunFailedError: boom")
    assert "status          failed: FlowRunFailedError: boom" in card.to_text().splitlines()


def _text_run(tmp_path):
    """A pure_text_ei run store as the trainer leaves it after 2 iterations (see pure_text_base)."""
    hp = HyperParameters(scenario="code_validation", trainer="pure_text_ei", dataset="nipflow-cv",
                         rl={"num_iterations": 2, "rollouts_per_iteration": 8})
    run = RunStore(str(tmp_path)).open_run("text-card", hp)
    run.write_json("state.json", {"iteration": 2, "train_loop_stage": "done"})
    run.append_metrics(0, {"mean_accuracy": 0.5, "fine_tune_trained_tokens": 0.0, "valid_decision_rate": 0.75,
                           "mean_episode_length": 2.5})
    run.append_metrics(1, {"mean_accuracy": 0.625, "fine_tune_trained_tokens": 300.0, "valid_decision_rate": 1.0,
                           "mean_episode_length": 1.25})
    run.append_metrics(1, {"kind": "test", "test_mean_accuracy": 0.75})
    # iteration 0: the prover's first job failed and was retried; iteration 1 tests only (scheme last)
    run.write_json("fine_tune/iter_0_prover.json", {"job_id": "ftjob-2", "attempt": 2, "file_id": "file-1",
                                                    "attempts": [{"attempt": 1, "job_id": "ftjob-1",
                                                                  "status": "failed", "error": "x"}]})
    run.write_json("fine_tune/iter_0_verifier.json", {"job_id": "ftjob-3", "attempt": 1, "file_id": "file-2"})
    run.write_json("stages/it0_await_fine_tune_jobs.json", {
        "iteration": 0, "stage": "await_fine_tune_jobs", "trained_tokens": {"prover": 200, "verifier": 100},
        "fine_tune_seconds": {"prover": 75.0, "verifier": 12.0}})
    run.write_json("stages/it0_sample_rollouts.json", {"iteration": 0, "stage": "sample_rollouts", "sampling_seconds": 95.25})
    # written before summaries had sampling_seconds: the stage's time is the sampling's
    run.write_json("stages/it1_sample_rollouts.json", {"iteration": 1, "stage": "sample_rollouts", "seconds": 3.5})
    run.write_json("stages/it0_log_stats.json", {"iteration": 0, "stage": "log_stats"})
    run.update_metadata(invocations=[
        {"started": "2026-01-01T10:00:00+00:00", "ended": "2026-01-01T10:01:00+00:00", "driver": "flow",
         "status": "failed", "message": "killed"},
        {"started": "2026-01-01T11:00:00+00:00", "driver": "flow"},  # SIGKILLed: never ended
        {"started": "2026-01-01T12:00:00+00:00", "ended": "2026-01-01T12:00:30+00:00", "driver": "flow",
         "status": "completed", "flow_run_id": "abc", "prefect_ui": "http://ui:4200/runs/flow-run/abc"}],
        wandb_run_id="w1", wandb_project="nipflow", wandb_mode="online")
    return run


def test_card_of_a_text_run_counts_jobs_attempts_and_trained_tokens(tmp_path):
    card = result_card(_text_run(tmp_path))
    assert card.text_run is True
    assert (card.iterations_done, card.iterations_planned, card.status) == (2, 2, "completed")
    assert (card.final_train_accuracy, card.final_test_accuracy) == (0.625, 0.75)
    assert card.fine_tune_jobs == 3 and card.trained_tokens == 300
    assert [(j.iteration, j.group, j.job_id, j.attempts, j.trained_tokens) for j in card.jobs] == [
        (0, "prover", "ftjob-2", 2, 200), (0, "verifier", "ftjob-3", 1, 100)]
    # this invocation 30 s; in total the two that ended (60 s + 30 s), of 3 recorded
    assert (card.wall_time_s, card.total_wall_time_s, card.invocations) == (30.0, 90.0, 3)
    assert card.prefect_ui == "http://ui:4200/runs/flow-run/abc" and card.flow_run_id == "abc"
    assert card.wandb == "project nipflow, run w1 (online)"
    text = card.to_text()
    assert "fine-tune jobs  3" in text and "trained tokens  300" in text
    assert [(i.iteration, i.valid_decision_rate, i.accuracy, i.test_accuracy, i.sampling_s, i.fine_tune_s)
            for i in card.per_iteration] == [(0, 0.75, 0.5, None, 95.25, {"prover": 75.0, "verifier": 12.0}),
                                             (1, 1.0, 0.625, 0.75, 3.5, {})]
    assert ("iteration 0     valid decisions 75% · accuracy 0.500 · episode length 2.50 · sampling 1 min 35 s"
            " · fine-tune prover 1 min 15 s · fine-tune verifier 12.0 s") in text
    assert ("iteration 1     valid decisions 100% · accuracy 0.625 · test 0.750 · episode length 1.25"
            " · sampling 3.5 s") in text
    assert "30.0 s this invocation, 1 min 30 s in total (3 invocation(s))" in text
    md = card.to_markdown()
    assert "| 0 | prover | `ftjob-2` | 2 | 200 |" in md
    assert "| iteration 1 | valid decisions 100% · accuracy 0.625 · test 0.750 · episode length 1.25 · sampling" in md
    assert "| Prefect UI | [http://ui:4200/runs/flow-run/abc](http://ui:4200/runs/flow-run/abc) |" in md


def test_invocations_are_recorded_and_bad_input_is_named(tmp_path):
    hp = HyperParameters.from_dict({"scenario": "graph_isomorphism", "trainer": "vanilla_ppo", "dataset": "t",
                                    "rl": {"num_iterations": 3}})
    run = RunStore(str(tmp_path)).open_run("inv", hp)
    assert invocation_count(run) == 0
    assert result_card(run).status == "not started"
    i = begin_invocation(run, "flow", flow_run_id="f1", prefect_ui="nipflow ui --runs-dir /x")
    assert i == 0 and invocation_count(run) == 1
    assert result_card(run).status == "running"
    with pytest.raises(ValueError, match="status"):
        end_invocation(run, i, "exploded")
    with pytest.raises(ValueError, match="index: run inv has 1 invocation"):
        end_invocation(run, 5, "completed")
    end_invocation(run, i, "preempted", "training preempted by SIGTERM")
    card = result_card(run)
    assert (card.status, card.message, card.prefect_ui, card.iterations_done) == (
        "preempted", "training preempted by SIGTERM", "nipflow ui --runs-dir /x", 0)

"""Rerun-tests mode: a base run's models are tested again without sampling or fine-tuning."""

from __future__ import annotations

import json

import pytest

import nip_core.trainers.catalogue  # noqa: F401
from nipflow_llm_server.testing import local_api_server
from nip_core.logging.wandb_reader import read_offline_runs
from nip_core.parameters import HyperParameters
from nip_core.parameters.base_run import merge_with_base_run, preserved_fields
from nip_core.settings import ExperimentSettings
from nip_core.trainers.build import build_trainer


def hp(**kw) -> HyperParameters:
    base = dict(scenario="code_validation", trainer="pure_text_ei", dataset="nipflow-cv",
                rl={"num_iterations": 2, "rollouts_per_iteration": 24, "num_test_iterations": 1},
                nip_protocol={"max_message_rounds": 4},
                dataset_options={"max_train_size": 24, "max_test_size": 4},
                text_rl={"verifier_guess_replacement_proportion": 0.5, "test_scheme": "none"})
    base.update(kw)
    return HyperParameters(**base)


def test_merge_keeps_only_the_preserved_fields_and_the_base_run_group():
    base = hp(seed=11)
    current = HyperParameters(scenario="code_validation", trainer="pure_text_ei", dataset="nipflow-cv",
                              rl={"num_iterations": 7, "num_test_iterations": 3},
                              text_rl={"test_scheme": "all", "test_on_whole_dataset": False},
                              base_run={"base_run_type": "rerun_tests", "run_id": "base"})
    assert set(preserved_fields(current, "rerun_tests")) == {
        "rl.num_test_iterations", "rl.test_greedy", "text_rl.test_scheme", "text_rl.test_on_whole_dataset"}
    merged = merge_with_base_run(current, base)
    assert merged.seed == 11 and merged.rl.num_iterations == 2 and merged.rl.rollouts_per_iteration == 24
    assert merged.rl.num_test_iterations == 3
    assert merged.text_rl.test_scheme == "all" and merged.text_rl.test_on_whole_dataset is False
    assert merged.text_rl.verifier_guess_replacement_proportion == 0.5
    assert merged.base_run == current.base_run
    # "parameters" preserves nothing of the test fields: everything but base_run comes from the base
    as_params = current.model_copy(update={"base_run": current.base_run.model_copy(
        update={"base_run_type": "parameters"})})
    assert merge_with_base_run(as_params, base).text_rl.test_scheme == "none"
    assert merge_with_base_run(base, current) is base  # base_run_type "none"


@pytest.mark.e2e
@pytest.mark.slow
def test_rerun_tests_replays_the_base_runs_models(tmp_path):
    with local_api_server(tmp_path, job_time_scale=0.02) as server:
        def settings(run_id, use_wandb=False):
            return ExperimentSettings(use_wandb=use_wandb, runs_dir=str(tmp_path / "runs"), run_id=run_id,
                                      openai_base_url=server.base_url, fine_tune_poll_interval_s=0.1,
                                      fine_tune_poll_max_interval_s=0.5, max_concurrent_requests=8,
                                      show_progress=False)

        base = build_trainer(hp(), settings("base", use_wandb=True))
        base.train()
        base.close()
        runs = tmp_path / "runs"
        (wandb_run,) = read_offline_runs(str(runs / "base"))
        # Artifact entries are named by their run-store path (what a W&B restore writes back).
        logged = {(a["name"], a["type"], tuple(a["files"])) for a in wandb_run["artifacts"]
                  if a["type"] != "state"}
        assert {("full_rollouts_base", "full_rollouts", ("rollouts/0.json",)),
                ("full_rollouts_base", "full_rollouts", ("rollouts/1.json",)),
                ("raw_transcript_base", "raw_transcript", ("transcripts/raw_0.yaml",)),
                ("raw_transcript_base", "raw_transcript", ("transcripts/raw_1.yaml",))} == logged
        states = [set(a["files"]) for a in wandb_run["artifacts"] if a["type"] == "state"]
        assert all({"hyper_params.json", "state.json", "metadata.json"} <= files for files in states)
        assert {a["name"] for a in wandb_run["artifacts"] if a["type"] == "state"} == {"state_base"}
        assert sum(a["name"] == "state_base" for a in wandb_run["artifacts"]) == 9  # one per stage run
        models = [json.loads((runs / "base" / "models" / f"iter_{i}.json").read_text()) for i in (0, 1)]
        assert models[0] == {"prover": "gpt-4o-mini-2024-07-18", "verifier": "gpt-4o-mini-2024-07-18"}
        assert models[1] != models[0]  # iteration 1 sampled with fine-tuned models
        state = json.loads((runs / "base" / "state.json").read_text())
        assert {g["last_status"] for g in state["shared_model_groups"].values()} == {"succeeded"}
        assert not (runs / "base" / "rollouts" / "test_0.json").exists()  # test scheme "none"

        current = HyperParameters(scenario="code_validation", trainer="pure_text_ei", dataset="nipflow-cv",
                                  rl={"num_test_iterations": 1},
                                  text_rl={"test_scheme": "all", "test_on_whole_dataset": True},
                                  base_run={"base_run_type": "rerun_tests", "run_id": "base"})
        rerun = build_trainer(current, settings("rerun"))
        assert rerun.hyper_params.rl.rollouts_per_iteration == 24 and rerun.rerun_tests
        rerun.train()
        rerun.close()
        assert rerun.next_stage() == (2, "done")
        # the rerun stepped through the base run's iterations; the last one it loaded was 1
        assert json.loads((runs / "rerun" / "state.json").read_text())["base_run_state_artifact_version"] == 1
        assert "metrics" in json.loads((runs / "rerun" / "stages" / "it2_test.json").read_text())  # final models
        for i in (0, 1):  # the same models, tested on the whole test set, nothing trained
            assert json.loads((runs / "rerun" / "models" / f"iter_{i}.json").read_text()) == models[i]
            assert len(json.loads((runs / "rerun" / "rollouts" / f"test_{i}.json").read_text())) == 4
            assert not (runs / "rerun" / "rollouts" / f"{i}.json").exists()
        rows = [json.loads(line) for line in (runs / "rerun" / "metrics.jsonl").read_text().splitlines()]
        assert sorted(r["iteration"] for r in rows if r.get("kind") == "test") == [0, 1]
        assert not [r for r in rows if r.get("kind", "train") == "train"]
        jobs = server.client().fine_tuning.jobs.list(limit=100).data
        assert not [j for j in jobs if (j.metadata or {}).get("nipflow_run_id") == "rerun"]
        assert len([j for j in jobs if (j.metadata or {}).get("nipflow_run_id") == "base"]) >= 1

"""``NullRun``: the run of a trainer that persists nothing."""

from __future__ import annotations

import os

import pytest

from nip_core.errors import CheckpointNotFoundError
from nip_core.experiment import make_params
from nip_core.runs import NullRun, Run
from nip_core.settings import ExperimentSettings
from nip_core.trainers import TrainerState
from nip_core.trainers.build import build_trainer

import nip_core.trainers.catalogue  # noqa: F401


def test_null_run_answers_the_run_interface_as_nothing_stored():
    params = make_params("code_validation", "pure_text_ei")
    run = NullRun("r1", params)
    assert (run.run_id, run.persistent, run.incarnation, run.params_hash) == ("r1", False, "none",
                                                                           params.params_hash())
    assert Run.persistent is True
    run.write_json("a.json", {"x": 1})
    run.save_state(TrainerState(iteration=3))
    run.save_checkpoint_bytes("iter_000001", b"data", iteration=1)
    run.check_lease()
    assert run.exists("a.json") is False and run.has_state() is False
    assert run.list_checkpoints() == [] and run.read_metrics() == []
    assert run.append_metrics(0, {"loss": 1.0}) is False
    assert run.metadata() == {} and run.update_metadata(updated="now") == {"updated": "now"}
    with pytest.raises(CheckpointNotFoundError, match=r"state file not found: \(no run store\)/state.json"):
        run.load_state(TrainerState)
    with pytest.raises(CheckpointNotFoundError, match=r"rollouts not found: \(no run store\)/rollouts/0.json"):
        run.read_json("rollouts/0.json", "rollouts")
    with pytest.raises(CheckpointNotFoundError, match=r"checkpoints/iter_000001.json"):
        run.load_checkpoint_bytes("iter_000001")
    assert NullRun().run_id == "NO_RUN_ID" and NullRun().params_hash is None


def test_null_run_has_every_public_method_of_run_that_trainers_call():
    wanted = {"write_json", "read_json", "exists", "check_lease", "save_state", "has_state", "load_state",
              "metadata", "update_metadata", "save_checkpoint_bytes", "load_checkpoint_bytes",
              "list_checkpoints", "read_metrics", "append_metrics"}
    assert wanted <= {n for n in dir(Run) if not n.startswith("_")}
    assert all(callable(getattr(NullRun, n)) for n in wanted)


@pytest.mark.parametrize("settings", [
    dict(),  # no run id: no run store
    dict(run_id="tr", test_run=True),  # a run id, but test_run: nothing is opened or written
])
def test_a_trainer_without_a_run_store_gets_a_null_run_and_writes_nothing(tmp_path, settings):
    params = make_params("code_validation", "pure_text_ei", overrides=["rl.num_iterations=2"])
    st = ExperimentSettings(use_wandb=False, runs_dir=str(tmp_path / "runs"), show_progress=False, **settings)
    trainer = build_trainer(params, st)
    assert isinstance(trainer.run, NullRun)
    assert trainer.run_id == settings.get("run_id", "NO_RUN_ID")
    trainer.state.iteration = 1
    trainer.save_state()
    trainer.reload_state()
    assert trainer.state.iteration == 0  # nothing was stored, so the state starts fresh
    trainer.records.write_summary(0, "log_stats", {"iteration": 0})
    assert trainer.stored_stage_summary(0, "log_stats") is None
    trainer.close()
    assert not os.path.exists(tmp_path / "runs")

"""Stage points: the trainer's own hooks and the process-wide point hooks see the same points."""

from __future__ import annotations

import pytest

from nip_core.parameters import HyperParameters
from nip_core.settings import ExperimentSettings
from nip_core.trainers.build import build_trainer
from nip_core.trainers.hooks import TrainerHooks, point_hooks, reach_point, register_point_hook

import nip_core.trainers.catalogue  # noqa: F401


class Recorder(TrainerHooks):
    def __init__(self):
        self.points: list[str] = []

    def at_point(self, iteration: int, stage: str, point: str) -> None:
        self.points.append(f"{iteration}:{stage}:{point}")


def test_register_point_hook_calls_it_after_the_trainer_hooks_until_unregistered():
    order = []

    class Own(TrainerHooks):
        def at_point(self, iteration, stage, point):
            order.append(("own", iteration, stage, point))

    class Extra(TrainerHooks):
        def at_point(self, iteration, stage, point):
            order.append(("extra", iteration, stage, point))

    before = point_hooks()
    extra = Extra()
    unregister = register_point_hook(extra)
    assert point_hooks() == (*before, extra)
    reach_point(Own(), 3, "log_stats", "end")
    assert order == [("own", 3, "log_stats", "end"), ("extra", 3, "log_stats", "end")]
    unregister()
    unregister()  # a second call is a no-op
    assert point_hooks() == before
    reach_point(Own(), 4, "test", "start")
    assert order[-1] == ("own", 4, "test", "start") and len(order) == 3
    with pytest.raises(TypeError, match="expects a TrainerHooks, got function"):
        register_point_hook(lambda *a: None)


def test_the_default_hooks_do_nothing_at_a_point():
    assert TrainerHooks().at_point(0, "sample_rollouts", "start") is None


@pytest.mark.e2e
def test_a_pure_text_trainer_reports_every_point_of_its_stages(tmp_path, server):
    hp = HyperParameters(scenario="code_validation", trainer="pure_text_ei", dataset="nipflow-cv",
                         rl={"num_iterations": 2, "rollouts_per_iteration": 12},
                         nip_protocol={"max_message_rounds": 2},
                         dataset_options={"max_train_size": 12, "max_test_size": 2},
                         text_rl={"test_scheme": "none", "verifier_guess_replacement_proportion": 0.5})
    st = ExperimentSettings(use_wandb=False, runs_dir=str(tmp_path / "runs"), run_id="points",
                            openai_base_url=server.base_url, fine_tune_poll_interval_s=0.1,
                            fine_tune_poll_max_interval_s=0.5, max_concurrent_requests=4, show_progress=False)
    own, process_wide = Recorder(), Recorder()
    unregister = register_point_hook(process_wide)
    try:
        trainer = build_trainer(hp, st, hooks=own)
        while trainer.next_stage().stage != "await_fine_tune_jobs":
            trainer.run_stage(trainer.next_stage().stage)
    finally:
        unregister()
    assert own.points == [
        "0:sample_rollouts:start", "0:sample_rollouts:before_save", "0:sample_rollouts:end",
        "0:log_stats:start", "0:log_stats:end", "0:test_during_training:start", "0:test_during_training:end",
        "0:create_fine_tune_jobs:start", "0:create_fine_tune_jobs:after_prover",
        "0:create_fine_tune_jobs:after_verifier", "0:create_fine_tune_jobs:end"]
    assert process_wide.points == own.points
    trainer.close()

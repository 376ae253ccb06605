"""Tasks get their trainer from a serialisable spec: kept by the flow, or rebuilt from the run store."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "flows"))

from flows.parameters import RunSpec  # noqa: E402
from nip_core.experiment import make_params  # noqa: E402
from nip_core.settings import ExperimentSettings  # noqa: E402
from tasks import trainers  # noqa: E402
from tasks.stages import execute_stage  # noqa: E402


@pytest.fixture
def fakes():
    import nipflow_fakes

    previous = nipflow_fakes.install()
    saved = dict(trainers._KEPT)
    trainers._KEPT.clear()
    yield nipflow_fakes
    trainers._KEPT.clear()
    trainers._KEPT.update(saved)
    nipflow_fakes.uninstall(previous)


def _spec(tmp_path, run_id="t1") -> RunSpec:
    params = make_params("code_validation", "pure_text_ei", overrides=["rl.num_iterations=2"])
    settings = ExperimentSettings(run_id=run_id, runs_dir=str(tmp_path / "runs"), use_wandb=False)
    return RunSpec.of(params, settings)


def test_the_spec_round_trips_through_json_and_keys_the_run(tmp_path, fakes):
    spec = _spec(tmp_path)
    again = RunSpec.model_validate_json(spec.model_dump_json())
    assert trainers.spec_key(again) == trainers.spec_key(spec) == ("t1", spec.hyper_params().params_hash())
    with pytest.raises(ValueError, match="spec.settings.run_id"):
        trainers.spec_key(spec.model_copy(update={"settings": {**spec.settings, "run_id": None}}))


def test_a_task_rebuilds_the_trainer_from_the_run_store_when_none_is_kept(tmp_path, fakes):
    spec = _spec(tmp_path)
    with trainers.task_trainer(spec) as first:
        assert isinstance(first, fakes.FakeTextTrainer) and first.run.run_id == "t1"
        assert execute_stage(first, "sample_rollouts", 0)["next_stage"] == "log_stats"
    # another task, another trainer object: it reads where the first one left the run
    with trainers.task_trainer(RunSpec.model_validate_json(spec.model_dump_json())) as second:
        assert second is not first
        assert second.next_stage() == (0, "log_stats")
        assert execute_stage(second, "log_stats", 0)["next_stage"] == "test_during_training"
    starts = [e for e in fakes.executions(tmp_path / "runs" / "t1") if e["event"] == "start"]
    assert [e["stage"] for e in starts] == ["sample_rollouts", "log_stats"]
    assert trainers._KEPT == {}  # rebuilt trainers are not kept


def test_a_kept_trainer_is_used_until_forgotten_or_released(tmp_path, fakes):
    from nip_core.trainers.build import build_trainer

    spec = _spec(tmp_path)
    flow_trainer = build_trainer(spec.hyper_params(), spec.experiment_settings())
    trainers.keep_trainer(spec, flow_trainer)
    with trainers.task_trainer(spec) as used:
        assert used is flow_trainer
    trainers.forget_trainer(spec)
    with trainers.task_trainer(spec) as used:
        assert used is not flow_trainer
    trainers.keep_trainer(spec, flow_trainer)
    trainers.release_trainer(flow_trainer)
    assert trainers.kept_trainer(spec) is None


def test_a_rebuilt_trainer_joins_the_parents_lease_claim(tmp_path, fakes):
    from nip_core.runs.lease import LeaseLostError
    from nip_core.trainers.build import build_trainer

    spec = _spec(tmp_path)
    parent = build_trainer(spec.hyper_params(), spec.experiment_settings())
    parent.run.lock.acquire()
    try:
        claimed = spec.model_copy(update={"lease": parent.run.lock.claim()})
        with trainers.task_trainer(claimed) as trainer:
            assert trainer is not parent and trainer.run.lock.held
        assert not trainer.run.lock.held and parent.run.lock.held  # the claim stays the parent's
        stale = spec.model_copy(update={"lease": {"owner": "someone-else", "generation": 99}})
        with pytest.raises(LeaseLostError, match="generation 99 is not the current claim"):
            with trainers.task_trainer(stale):
                pass
    finally:
        parent.run.lock.release()

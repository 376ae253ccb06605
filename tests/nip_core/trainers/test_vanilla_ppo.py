"""vanilla_ppo: resume by iteration, checkpoints, loss variants, update schedules."""

from __future__ import annotations

import pytest
import torch

from nip_core.errors import CheckpointNotFoundError, CorruptCheckpointError
from tests.nip_core.trainers.gi_helpers import TINY, make_trainer, params_of, settings_for, tiny_params, tiny_scenario


@pytest.mark.parametrize("loss_type", ["clip", "kl_penalty"])
def test_resume_is_bit_identical(tmp_path, loss_type):
    hp = tiny_params(ppo=dict(loss_type=loss_type))
    straight = make_trainer(hp, tmp_path / "a")
    initial = params_of(straight)
    straight.run_iterations(0, 6)

    first = make_trainer(hp, tmp_path / "b")
    first.run_iterations(0, 3)
    assert first.run.list_checkpoints() == ["iter_000003"]
    del first  # "the process stops"
    second = make_trainer(hp, tmp_path / "b")  # a new process: fresh objects, same run store
    assert second._memory_iteration == 0
    second.run_iterations(3, 6)
    assert second._memory_iteration == 6 and second.state.iteration == 6

    a, b = params_of(straight), params_of(second)
    assert any(not torch.equal(initial[k], a[k]) for k in a)  # training changed something
    for key in a:
        assert torch.equal(a[key], b[key]), key
    if loss_type == "kl_penalty":
        assert torch.equal(straight.loss_module.beta, second.loss_module.beta)
    # the next batch would also be the same: the carried-over episodes and RNGs match
    assert torch.equal(straight._carried_td["round"], second._carried_td["round"])
    assert torch.equal(straight._base_env(straight.train_env).rng.get_state(),
                       second._base_env(second.train_env).rng.get_state())


def test_resume_without_episode_state_would_differ(tmp_path):
    """Dropping the carried-over episode state changes the result (the test above can fail)."""
    hp = tiny_params()
    straight = make_trainer(hp, tmp_path / "a")
    straight.run_iterations(0, 4)
    first = make_trainer(hp, tmp_path / "b")
    first.run_iterations(0, 2)
    second = make_trainer(hp, tmp_path / "b")
    second.restore_latest_checkpoint()
    second._carried_td = second.train_env.reset()  # lose the mid-episode state
    second.run_iterations(2, 4)
    a, b = params_of(straight), params_of(second)
    assert any(not torch.equal(a[k], b[k]) for k in a)


def test_checkpoint_every_and_missing_or_corrupt_checkpoint(tmp_path):
    hp = tiny_params(rl=dict(num_iterations=4))
    trainer = make_trainer(hp, tmp_path, checkpoint_every=2)
    trainer.run_iterations(0, 3)
    assert sorted(trainer.run.list_checkpoints()) == ["iter_000002", "iter_000003"]
    fresh = make_trainer(hp, tmp_path / "other")
    with pytest.raises(CheckpointNotFoundError):
        fresh.run_iterations(2, 4)
    path = tmp_path / "r" / "checkpoints" / "iter_000003.pt"
    path.write_bytes(path.read_bytes()[:-10] + b"0123456789")
    again = make_trainer(hp, tmp_path)
    with pytest.raises(CorruptCheckpointError):
        again.run_iterations(3, 4)


def test_train_runs_and_resumes_from_state(tmp_path):
    hp = tiny_params(rl=dict(num_iterations=2))
    trainer = make_trainer(hp, tmp_path)
    trainer.train()
    assert trainer.state.iteration == 2
    metrics = trainer.run.read_metrics()
    kinds = [(row["kind"], row["iteration"]) for row in metrics]
    assert ("train", 0) in kinds and ("train", 1) in kinds and ("test", 2) in kinds
    row = next(r for r in metrics if r["kind"] == "train")
    for key in ("prover.mean_step_reward", "verifier.mean_step_reward", "loss_objective", "loss_critic",
                "entropy"):
        assert key in row
    test_row = next(r for r in metrics if r["kind"] == "test")
    assert 0.0 <= test_row["test_mean_accuracy"] <= 1.0 and "test_decision_rate" in test_row
    # a second train() has nothing left to train: parameters stay as they are
    before = params_of(trainer)
    again = make_trainer(hp, tmp_path)
    again.train()
    after = params_of(again)
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_inactive_update_schedule_freezes_agent(tmp_path):
    frozen = {**TINY, "update_schedule": {"kind": "contiguous_periodic", "period": 10, "start": 5, "stop": 10}}
    hp = tiny_params(agents={"_default": TINY, "prover": frozen}, rl=dict(num_iterations=2))
    trainer = make_trainer(hp, tmp_path)
    before = params_of(trainer)
    trainer.run_iterations(0, 2)
    after = params_of(trainer)
    prover_keys = [k for k in before if ".prover." in k]
    verifier_keys = [k for k in before if ".verifier." in k]
    assert prover_keys and all(torch.equal(before[k], after[k]) for k in prover_keys)
    assert any(not torch.equal(before[k], after[k]) for k in verifier_keys)


@pytest.mark.parametrize("trainer_name", ["vanilla_ppo", "reinforce", "spg"])
@pytest.mark.parametrize("shared", [True, False])
def test_every_loss_module_parameter_is_optimised(tmp_path, trainer_name, shared):
    from nip_core.trainers.registry import get_trainer_class

    hp = tiny_params(trainer_name, rl=dict(use_shared_body=shared))
    settings = settings_for(tmp_path)
    trainer = get_trainer_class(trainer_name)(hp, settings=settings, scenario_instance=tiny_scenario(hp, settings))
    in_optimizer = {id(p) for g in trainer.optimizer.param_groups for p in g["params"]}
    loss_params = {id(p) for p in trainer.loss_module.parameters()}
    assert loss_params == in_optimizer
    assert len(in_optimizer) == sum(len(g["params"]) for g in trainer.optimizer.param_groups)  # no duplicates

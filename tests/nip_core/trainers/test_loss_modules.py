"""The RL losses as TorchRL ``LossModule``s: keys, the guide's GAE, a custom loss in the trainer."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torchrl.objectives import LossModule, ValueEstimators
from torchrl.objectives.value import GAE

from nip_core.environments.rollouts import collect_batch
from nip_core.trainers.objectives.base import NipLossModule
from nip_core.trainers.objectives.ppo import ClipPpoLoss
from nip_core.trainers.objectives.spg import SpgLoss
from nip_core.trainers.reinforce import ReinforceTrainer
from nip_core.trainers.spg import SpgTrainer
from nip_core.trainers.vanilla_ppo import VanillaPpoTrainer
from tests.nip_core.trainers.gi_helpers import per_agent_gae, settings_for, tiny_params, tiny_scenario

TRAINERS = {
    "vanilla_ppo": (VanillaPpoTrainer, {}),
    "vanilla_ppo_kl": (VanillaPpoTrainer, dict(ppo=dict(loss_type="kl_penalty"))),
    "reinforce": (ReinforceTrainer, {}),
    "reinforce_critic": (ReinforceTrainer, dict(reinforce=dict(use_advantage_and_critic=True))),
    "spg": (SpgTrainer, dict(spg=dict(variant="spg", ihvp_rank=3))),
}


def build(tmp_path, name="vanilla_ppo", trainer_class=None, **rl):
    cls, overrides = TRAINERS[name]
    trainer_name = {VanillaPpoTrainer: "vanilla_ppo", ReinforceTrainer: "reinforce", SpgTrainer: "spg"}[cls]
    hp = tiny_params(trainer_name, rl=dict(num_iterations=2, gamma=0.95, lmbda=0.95, **rl), **overrides)
    settings = settings_for(tmp_path)
    return (trainer_class or cls)(hp, settings=settings, scenario_instance=tiny_scenario(hp, settings))


def collected_batch(trainer):
    """One training batch with values, advantages and value targets from the trainer's GAE."""
    with torch.no_grad():
        batch, _ = collect_batch(trainer.train_env, trainer.policy_operator, trainer._carried_td.clone(),
                                 trainer.steps_per_env)
        trainer._add_values_and_advantages(batch)
    return batch


@pytest.mark.parametrize("name", list(TRAINERS))
def test_every_loss_is_a_loss_module_owning_the_trainers_gae(tmp_path, name):
    trainer = build(tmp_path, name)
    loss = trainer.loss_module
    assert isinstance(loss, LossModule) and isinstance(loss, NipLossModule)
    assert loss.tensor_keys.action == ("agents", trainer.message_key)
    assert ("agents", trainer.message_key) in loss.in_keys
    if loss.use_critic:
        assert trainer.value_estimator is loss.value_estimator
        assert isinstance(loss.value_estimator, GAE)
        assert loss.value_estimator.tensor_keys.advantage == ("agents", "advantage")
        assert float(loss.value_estimator.gamma) == pytest.approx(0.95)
    else:
        assert trainer.value_estimator is None
        assert ("agents", "reward_to_go") in loss.in_keys
    # The estimator is no submodule: checkpoints hold exactly the agents' and the loss's own state.
    assert not any("value_estimator" in key for key in loss.state_dict())


def test_set_keys_renames_what_the_loss_reads(tmp_path):
    trainer = build(tmp_path)
    minibatch = collected_batch(trainer).reshape(-1)[:16]
    loss = trainer.loss_module
    with torch.no_grad():
        reference = loss(minibatch)
    renamed = minibatch.clone()
    renamed.rename_key_(("agents", "advantage"), ("agents", "my_advantage"))
    renamed.rename_key_(("agents", "sample_log_prob"), ("agents", "old_log_prob"))
    loss.set_keys(advantage=("agents", "my_advantage"), sample_log_prob=("agents", "old_log_prob"))
    assert ("agents", "my_advantage") in loss.in_keys and ("agents", "advantage") not in loss.in_keys
    # The GAE of the loss writes the renamed advantage from now on.
    assert loss.value_estimator.tensor_keys.advantage == ("agents", "my_advantage")
    with torch.no_grad():
        out = loss(renamed)
        assert torch.equal(out["loss_objective"], reference["loss_objective"])
        assert torch.equal(out["agents", "kl_divergence"], reference["agents", "kl_divergence"])
        with pytest.raises(KeyError):  # the default names are no longer read
            loss(minibatch)
    loss.set_keys(advantage=None, sample_log_prob=None)  # back to the defaults
    assert loss.tensor_keys.advantage == ("agents", "advantage")
    assert loss.tensor_keys.action == ("agents", trainer.message_key)
    with pytest.raises(ValueError, match="not_a_key"):
        loss.set_keys(not_a_key=("agents", "x"))


def test_a_loss_built_the_guides_way_gives_the_trainers_advantage(tmp_path):
    trainer = build(tmp_path)
    batch = collected_batch(trainer)
    loss = ClipPpoLoss(trainer.agents, trainer.hyper_params, trainer.message_key)
    loss.make_value_estimator(ValueEstimators.GAE, gamma=0.95, lmbda=0.95)
    gae = loss.value_estimator
    fresh = batch.exclude(("agents", "advantage"), ("agents", "value_target"))
    gae(fresh)
    assert torch.equal(fresh["agents", "advantage"], batch["agents", "advantage"])
    assert torch.equal(fresh["agents", "value_target"], batch["agents", "value_target"])
    old_path = batch.exclude(("agents", "advantage"), ("agents", "value_target"))
    per_agent_gae(trainer.hyper_params)(old_path)  # the GAE the trainers built before
    assert torch.equal(old_path["agents", "advantage"], batch["agents", "advantage"])
    assert not torch.equal(fresh["agents", "advantage"], torch.zeros_like(fresh["agents", "advantage"]))
    # Without arguments the defaults are rl.gamma and rl.lmbda.
    loss.make_value_estimator()
    assert float(loss.value_estimator.gamma) == pytest.approx(0.95) and loss.value_estimator is not gae
    with pytest.raises(NotImplementedError, match="ValueEstimators.GAE"):
        loss.make_value_estimator(ValueEstimators.TD0)


def test_moving_the_loss_moves_its_value_estimator():
    agents = torch.nn.Module()
    agents.agent_names = ["a", "b"]
    hp = tiny_params(rl=dict(gamma=0.5, lmbda=0.25))
    loss = ClipPpoLoss(agents, hp, "message", use_critic=False)
    loss.make_value_estimator()
    assert loss.value_estimator.lmbda.dtype == torch.float32 and float(loss.value_estimator.lmbda) == 0.25
    loss.to(torch.float64)
    assert loss.value_estimator.lmbda.dtype == torch.float64


class AdvantageWeightedLoss(NipLossModule):
    """A custom loss: advantage-weighted log-likelihood plus the shared critic term."""

    out_keys = ["loss_actor", "loss_critic"]
    loss_terms = ("loss_actor", "loss_critic")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.backward_calls = 0

    def forward(self, td):
        log_prob, _ = self.log_prob_and_entropy(td)
        actor = (-log_prob * self.advantage(td)).mean(0)
        critic = self.critic_term(self.agents.value(td), td)
        return self.pack({"loss_actor": actor.sum(), "loss_critic": critic.sum()},
                         {"loss_actor": actor, "loss_critic": critic}, actor.shape[0])

    def backward(self, losses):
        self.backward_calls += 1
        super().backward(losses)


class CustomLossTrainer(VanillaPpoTrainer):
    def _get_loss_module_and_gae(self):
        loss = AdvantageWeightedLoss(self.agents, self.hyper_params, self.message_key)
        loss.make_value_estimator(ValueEstimators.GAE)
        return loss, loss.value_estimator


def test_a_custom_loss_module_drops_into_the_trainer(tmp_path):
    trainer = build(tmp_path, trainer_class=CustomLossTrainer)
    before = {k: v.clone() for k, v in trainer.agents.state_dict().items()}
    stats = trainer._train_iteration(0)
    hp = trainer.hyper_params.rl
    assert trainer.loss_module.backward_calls == hp.num_epochs * (hp.frames_per_batch // hp.minibatch_size) == 4
    assert {"loss_actor", "loss_critic", "prover.loss_actor", "verifier.loss_actor"} <= set(stats)
    assert "loss_objective" not in stats
    after = trainer.agents.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in after if "value" in k)
    assert any(not torch.equal(before[k], after[k]) for k in after if "policy" in k)
    assert all(torch.isfinite(after[k]).all() for k in after if after[k].is_floating_point())


def test_spg_cross_term_and_lola_correction_follow_their_equations():
    vec = lambda *xs: [torch.tensor(xs)]  # noqa: E731
    # J m = <m, s_F> c_grad + <m, grad_F> c_score = 3 [1, 1] + 2 [2, -1]
    term = SpgLoss.leader_follower_cross_term(vec(1.0, 2.0), vec(3.0, 0.0), vec(0.0, 1.0),
                                              vec(1.0, 1.0), vec(2.0, -1.0))
    assert term[0].tolist() == [7.0, 1.0]
    grads = SimpleNamespace(score={"L": vec(1.0, 0.0), "F": vec(0.0, 2.0)},
                            cross={("L", "F"): vec(1.0, 1.0), ("L", "L"): vec(0.0, 3.0)})
    # <s_F, g_F> grad_L L_L + <grad_F L_L, g_F> s_L = 4 [0, 3] + 3 [1, 0] with g_F = [1, 2]
    correction = SpgLoss.lola_correction(grads, "L", "F", vec(1.0, 2.0))
    assert correction[0].tolist() == [3.0, 12.0]

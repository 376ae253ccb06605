"""Objective maths: GAE per agent, advantage normalisation, PPO clip objective, KL adaptation."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from nip_core.parameters import HyperParameters
from nip_core.trainers.objectives.common import normalized_advantage
from nip_core.trainers.objectives.ppo import ClipPpoLoss, KlPenaltyPpoLoss
from nip_core.trainers.objectives.reinforce import ReinforceLoss
from tests.nip_core.trainers.gi_helpers import per_agent_gae


def hp(**kw):
    return HyperParameters(scenario="graph_isomorphism", trainer="vanilla_ppo", dataset="test",
                           rl=dict(gamma=0.5, lmbda=0.5), **kw)


def test_gae_per_agent_stops_at_episode_ends():
    T = 3
    reward = torch.tensor([[1.0, 0.0], [0.0, 2.0], [4.0, 0.0]]).view(1, T, 2, 1)
    value = torch.tensor([[0.5, 1.0], [1.0, 0.0], [2.0, 1.0]]).view(1, T, 2, 1)
    next_value = torch.tensor([[1.0, 0.0], [2.0, 1.0], [3.0, 3.0]]).view(1, T, 2, 1)
    done = torch.tensor([False, True, False]).view(1, T, 1, 1).expand(1, T, 2, 1)
    td = TensorDict({
        "agents": TensorDict({"value": value}, batch_size=(1, T, 2)),
        "next": TensorDict({"agents": TensorDict({"reward": reward, "value": next_value, "done": done,
                                                  "terminated": done}, batch_size=(1, T, 2))},
                           batch_size=(1, T)),
    }, batch_size=(1, T))
    per_agent_gae(hp())(td)
    gamma = lmbda = 0.5
    expected = torch.zeros(T, 2)
    for a in range(2):
        running = 0.0
        for t in reversed(range(T)):
            not_done = 0.0 if bool(done[0, t, a]) else 1.0
            delta = reward[0, t, a, 0] + gamma * next_value[0, t, a, 0] * not_done - value[0, t, a, 0]
            running = delta + gamma * lmbda * not_done * running
            expected[t, a] = running
    assert torch.allclose(td["agents", "advantage"].view(T, 2), expected)
    assert torch.allclose(td["agents", "value_target"].view(T, 2), expected + value.view(T, 2))


def test_advantage_normalised_per_agent():
    adv = torch.tensor([[1.0, 10.0], [3.0, 30.0], [5.0, 50.0]]).unsqueeze(-1)
    td = TensorDict({"agents": TensorDict({"advantage": adv}, batch_size=(3, 2))}, batch_size=(3,))
    out = normalized_advantage(td, True)
    assert torch.allclose(out[:, 0], torch.tensor([-1.0, 0.0, 1.0]))
    assert torch.allclose(out[:, 1], torch.tensor([-1.0, 0.0, 1.0]))


class _Agents(torch.nn.Module):
    agent_names = ["a", "b"]


def test_clip_objective_and_kl_coefficient_adaptation():
    loss = ClipPpoLoss(_Agents(), hp(ppo=dict(clip_epsilon=0.2)), "node_selected", use_critic=False)
    ratio = torch.tensor([[1.5, 0.5], [0.9, 1.1]])
    advantage = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    # agent a: min(1.5, 1.2) = 1.2 and min(-0.9, -0.9) = -0.9 -> -(0.3)/2; agent b: min(0.5, 0.8)=0.5,
    # min(-1.1, -1.1) = -1.1 -> -(-0.6)/2
    assert torch.allclose(loss.objective(ratio, ratio.log(), advantage), torch.tensor([-0.15, 0.3]))
    kl = KlPenaltyPpoLoss(_Agents(), hp(ppo=dict(kl_target=0.01, kl_beta=1.0)), "node_selected", use_critic=False)
    log_weight = torch.tensor([[-0.5, 0.0], [-0.5, 0.0]])  # KL_a = 0.5 (> 1.5 target), KL_b = 0 (< target/1.5)
    kl.objective(log_weight.exp(), log_weight, torch.zeros(2, 2))
    assert kl.beta.tolist() == [2.0, 0.5]


ENTROPY = torch.tensor([[1.0, 2.0], [3.0, 6.0]])  # (batch, agent): per-agent means 2 and 4


class _FixedPpo(ClipPpoLoss):
    def log_weight_and_entropy(self, td, logits=None):
        return torch.zeros(2, 2), torch.tensor([[-0.5, 0.0], [-0.5, 0.2]]), ENTROPY

    def advantage(self, td):
        return torch.ones(2, 2)


class _FixedReinforce(ReinforceLoss):
    def log_prob_and_entropy(self, td, logits=None):
        return torch.zeros(2, 2), ENTROPY


def test_logged_entropy_and_kl_are_nips_sum_over_agents_and_mean_over_agents():
    params = hp(ppo=dict(entropy_eps=0.5))
    ppo = _FixedPpo(_Agents(), params, "node_selected", use_critic=False)(TensorDict({}, batch_size=[]))
    assert float(ppo["entropy"]) == 6.0  # nip: sum_a mean_b H (a mean over agents would be 3.0)
    assert torch.allclose(ppo["agents", "loss_entropy"], torch.tensor([-1.0, -2.0]))
    assert float(ppo["loss_entropy"]) == -3.0
    # nip: kl = -log_weight.mean(0) per agent (0.5, -0.1), logged as its mean over agents
    assert float(ppo["kl_divergence"]) == pytest.approx(0.2)
    td = TensorDict({"agents": TensorDict({"reward_to_go": torch.zeros(2, 2, 1)}, batch_size=(2, 2))},
                    batch_size=(2,))
    reinforce = _FixedReinforce(_Agents(), params, "node_selected", use_critic=False)
    assert float(reinforce(td)["entropy"]) == 6.0

"""REINFORCE loss (docs/behaviour.md#b26): ``loss_actor[a] = mean_b(-log_prob_a * weight_a)``.

The weight is the discounted reward-to-go within each episode (default) or, with
``reinforce.use_advantage_and_critic``, the normalised GAE advantage, in which case the
critic loss is added too (a fix, docs/behaviour.md#b26: the original's critic variant read a key that
was never written).
"""

from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase
from torch import Tensor, nn

from nip_core.trainers.objectives.base import NipLossModule


def reward_to_go(reward: Tensor, done: Tensor, gamma: float) -> Tensor:
    """Discounted return from each step to its episode's end (or the batch end).

    Parameters
    ----------
    reward, done : (B, T, ...)
        Time is dim 1; ``done[:, t]`` ends an episode after step ``t``.
    """
    out = torch.zeros_like(reward)
    running = torch.zeros_like(reward[:, 0])
    for t in range(reward.shape[1] - 1, -1, -1):
        running = reward[:, t] + gamma * running * (~done[:, t]).to(reward.dtype)
        out[:, t] = running
    return out


class ReinforceLoss(NipLossModule):
    """Policy-gradient loss per agent, summed; optional critic (keys and terms from the base)."""

    out_keys = ["loss_actor", "loss_critic", "entropy"]
    loss_terms = ("loss_actor", "loss_critic")

    def __init__(self, agents: nn.Module, hyper_params, message_key: str, use_critic: bool):
        super().__init__(agents, hyper_params, message_key, use_critic)

    def _set_in_keys(self) -> None:
        weight = "advantage" if self.use_critic else "reward_to_go"
        self.in_keys = [self.tensor_keys.action, self.tensor_keys.decision, getattr(self.tensor_keys, weight)]

    def forward(self, td: TensorDictBase) -> TensorDict:
        log_prob, entropy = self.log_prob_and_entropy(td)
        if self.use_critic:
            weight = self.advantage(td)
        else:
            weight = td[self.tensor_keys.reward_to_go].squeeze(-1)
        actor = (-log_prob * weight).mean(0)
        per_agent = {"loss_actor": actor}
        out = {"loss_actor": actor.sum(), "entropy": self.logged_entropy(entropy)}
        if self.use_critic:
            critic = self.critic_term(self.agents.value(td), td)
            per_agent["loss_critic"] = critic
            out["loss_critic"] = critic.sum()
        return self.pack(out, per_agent, actor.shape[0])

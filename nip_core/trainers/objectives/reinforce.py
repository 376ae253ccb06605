"""REINFORCE loss (``nip_spec.md`` §5.3): ``loss_actor[a] = mean_b(-log_prob_a * weight_a)``.

The weight is the discounted reward-to-go within each episode (default) or, with
``reinforce.use_advantage_and_critic``, the normalised GAE advantage, in which case the
critic loss is added too (fix of QUIRK 13: the original's critic variant read a key that
was never written).
"""

from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase
from torch import Tensor, nn

from nip_core.agents.distributions import joint_log_prob_and_entropy
from nip_core.trainers.objectives.common import critic_loss, normalized_advantage, resolve_clip_value


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


class ReinforceLoss(nn.Module):
    """Policy-gradient loss per agent, summed; optional critic."""

    out_keys = ["loss_actor", "loss_critic", "entropy"]

    def __init__(self, agents: nn.Module, hyper_params, message_key: str, use_critic: bool):
        super().__init__()
        self.agents = agents
        self.message_key = message_key
        self.use_critic = use_critic
        self.normalize_advantage = hyper_params.ppo.normalize_advantage
        self.critic_coef = hyper_params.ppo.critic_coef
        self.loss_critic_type = hyper_params.rl.loss_critic_type
        self.clip_value = resolve_clip_value(hyper_params)
        weight_key = ("agents", "advantage") if use_critic else ("agents", "reward_to_go")
        self.in_keys = [("agents", message_key), ("agents", "decision"), weight_key]

    def forward(self, td: TensorDictBase) -> TensorDict:
        message_logits, decision_logits = self.agents.policy(td)
        log_prob, entropy = joint_log_prob_and_entropy(message_logits, decision_logits,
                                                       td["agents", self.message_key], td["agents", "decision"])
        if self.use_critic:
            weight = normalized_advantage(td, self.normalize_advantage)
        else:
            weight = td["agents", "reward_to_go"].squeeze(-1)
        actor = (-log_prob * weight).mean(0)
        per_agent = {"loss_actor": actor}
        out = {"loss_actor": actor.sum(), "entropy": entropy.mean().detach()}
        if self.use_critic:
            critic = self.critic_coef * critic_loss(self.agents.value(td), td, self.loss_critic_type,
                                                    self.clip_value)
            per_agent["loss_critic"] = critic
            out["loss_critic"] = critic.sum()
        out["agents"] = TensorDict(per_agent, batch_size=actor.shape)
        return TensorDict(out, batch_size=[])

    def backward(self, losses: TensorDictBase) -> None:
        total = losses["loss_actor"]
        if "loss_critic" in losses.keys():
            total = total + losses["loss_critic"]
        total.backward()

"""PPO losses with one objective per agent (``nip_spec.md`` §5.3), summed over agents.

``ClipPpoLoss``: ``L[a] = -mean_b min(r_a A_a, clip(r_a, 1-eps, 1+eps) A_a)``.
``KlPenaltyPpoLoss``: ``L[a] = -mean_b r_a A_a + beta_a KL_a`` with ``KL_a = mean(-log r_a)``
and per-agent ``beta_a`` adapted after every call (x ``kl_increment`` above 1.5 x target,
x ``kl_decrement`` below target / 1.5). Both add an entropy bonus and, with a critic, the
critic loss. Advantages are normalised per agent.

Declared keys: ``in_keys`` (what ``forward`` reads from a minibatch) and ``out_keys`` (the
entries of the returned loss tensordict).
"""

from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn

from nip_core.agents.distributions import joint_log_prob_and_entropy
from nip_core.trainers.objectives.common import critic_loss, normalized_advantage, resolve_clip_value


class PpoLoss(nn.Module):
    """Base of the per-agent PPO losses; ``backward`` sums objective, critic and entropy terms."""

    out_keys = ["loss_objective", "loss_critic", "loss_entropy", "entropy", "kl_divergence"]

    def __init__(self, agents: nn.Module, hyper_params, message_key: str, use_critic: bool = True):
        super().__init__()
        self.agents = agents
        self.message_key = message_key
        self.use_critic = use_critic
        ppo = hyper_params.ppo
        self.clip_epsilon = ppo.clip_epsilon
        self.entropy_coef = ppo.entropy_eps
        self.critic_coef = ppo.critic_coef
        self.normalize_advantage = ppo.normalize_advantage
        self.loss_critic_type = hyper_params.rl.loss_critic_type
        self.clip_value = resolve_clip_value(hyper_params)
        self.in_keys = [("agents", self.message_key), ("agents", "decision"), ("agents", "sample_log_prob"),
                        ("agents", "advantage"), ("agents", "value_target"), ("agents", "value")]

    def log_weight_and_entropy(self, td: TensorDictBase, logits=None):
        """``(log_prob, log_weight, entropy)`` of the stored actions, each ``(n, A)``.

        ``logits``: ``(message_logits, decision_logits)`` already computed (else the policy runs).
        """
        message_logits, decision_logits = self.agents.policy(td) if logits is None else logits
        log_prob, entropy = joint_log_prob_and_entropy(message_logits, decision_logits,
                                                       td["agents", self.message_key], td["agents", "decision"])
        return log_prob, log_prob - td["agents", "sample_log_prob"], entropy

    def objective(self, ratio, log_weight, advantage):  # pragma: no cover - abstract
        raise NotImplementedError

    def forward(self, td: TensorDictBase) -> TensorDict:
        if self.use_critic:  # policy and critic in one pass of the bodies
            message_logits, decision_logits, values = self.agents.policy_and_value(td)
            _, log_weight, entropy = self.log_weight_and_entropy(td, (message_logits, decision_logits))
        else:
            _, log_weight, entropy = self.log_weight_and_entropy(td)
        advantage = normalized_advantage(td, self.normalize_advantage)
        objective = self.objective(log_weight.exp(), log_weight, advantage)  # (A,)
        entropy_loss = -self.entropy_coef * entropy.mean(0)
        kl = (-log_weight).mean(0).detach()
        per_agent = {"loss_objective": objective, "loss_entropy": entropy_loss, "kl_divergence": kl}
        out = {"loss_objective": objective.sum(), "loss_entropy": entropy_loss.sum(),
               "entropy": entropy.mean().detach(), "kl_divergence": kl.mean()}
        if self.use_critic:
            critic = self.critic_coef * critic_loss(values, td, self.loss_critic_type,
                                                    self.clip_value)
            per_agent["loss_critic"] = critic
            out["loss_critic"] = critic.sum()
        out["agents"] = TensorDict(per_agent, batch_size=objective.shape)
        return TensorDict(out, batch_size=[])

    @staticmethod
    def total_loss(losses: TensorDictBase) -> torch.Tensor:
        total = losses["loss_objective"] + losses["loss_entropy"]
        if "loss_critic" in losses.keys():
            total = total + losses["loss_critic"]
        return total

    def backward(self, losses: TensorDictBase) -> None:
        self.total_loss(losses).backward()


class ClipPpoLoss(PpoLoss):
    """Clipped-surrogate PPO, one objective per agent."""

    def objective(self, ratio, log_weight, advantage):
        clipped = ratio.clamp(1 - self.clip_epsilon, 1 + self.clip_epsilon)
        return -torch.minimum(ratio * advantage, clipped * advantage).mean(0)


class KlPenaltyPpoLoss(PpoLoss):
    """KL-penalised PPO with an adaptive coefficient per agent (a persistent buffer)."""

    def __init__(self, agents, hyper_params, message_key, use_critic=True):
        super().__init__(agents, hyper_params, message_key, use_critic)
        ppo = hyper_params.ppo
        self.kl_target, self.kl_increment, self.kl_decrement = ppo.kl_target, ppo.kl_increment, ppo.kl_decrement
        self.register_buffer("beta", torch.full((len(agents.agent_names),), float(ppo.kl_beta)))

    def objective(self, ratio, log_weight, advantage):
        kl = (-log_weight).mean(0)
        objective = -(ratio * advantage).mean(0) + self.beta.clone() * kl
        with torch.no_grad():  # masked by torch.where: no boolean indexing, no host synchronisation
            one = torch.ones_like(kl)
            factor = torch.where(kl > 1.5 * self.kl_target, one * self.kl_increment,
                                 torch.where(kl < self.kl_target / 1.5, one * self.kl_decrement, one))
            self.beta.mul_(factor)
        return objective

"""PPO losses with one objective per agent (docs/behaviour.md#b25), summed over agents.

``ClipPpoLoss``: ``L[a] = -mean_b min(r_a A_a, clip(r_a, 1-eps, 1+eps) A_a)``.
``KlPenaltyPpoLoss``: ``L[a] = -mean_b r_a A_a + beta_a KL_a`` with ``KL_a = mean(-log r_a)``
and per-agent ``beta_a`` adapted after every call (x ``kl_increment`` above 1.5 x target,
x ``kl_decrement`` below target / 1.5). Both add an entropy bonus and, with a critic, the
critic loss. Advantages are normalised per agent.

Keys, log-probs, critic and entropy terms and the summed loss come from
:class:`~nip_core.trainers.objectives.base.NipLossModule` (a TorchRL ``LossModule``); the
keys read are its ``in_keys`` (renamable with ``set_keys``), the entries of the returned
loss tensordict its ``out_keys``. The whole update reads top to bottom in
:meth:`PpoLoss.forward`.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase

from nip_core.trainers.objectives.base import NipLossModule


class PpoLoss(NipLossModule):
    """Base of the per-agent PPO losses; ``backward`` sums objective, entropy and critic terms."""

    out_keys = ["loss_objective", "loss_critic", "loss_entropy", "entropy", "kl_divergence"]
    loss_terms = ("loss_objective", "loss_entropy", "loss_critic")

    def __init__(self, agents, hyper_params, message_key: str, use_critic: bool = True):
        super().__init__(agents, hyper_params, message_key, use_critic)
        self.clip_epsilon = hyper_params.ppo.clip_epsilon

    def objective(self, ratio, log_weight, advantage):  # pragma: no cover - abstract
        """Per-agent ``(A,)`` objective from ratios, log-ratios and advantages, each ``(n, A)``."""
        raise NotImplementedError

    def forward(self, td: TensorDictBase) -> TensorDict:
        if self.use_critic:  # policy and critic in one pass of the bodies
            message_logits, decision_logits, values = self.agents.policy_and_value(td)
            _, log_weight, entropy = self.log_weight_and_entropy(td, (message_logits, decision_logits))
        else:
            _, log_weight, entropy = self.log_weight_and_entropy(td)
        advantage = self.advantage(td)
        objective = self.objective(log_weight.exp(), log_weight, advantage)  # (A,)
        entropy_loss = self.entropy_term(entropy)
        kl = (-log_weight).mean(0).detach()
        per_agent = {"loss_objective": objective, "loss_entropy": entropy_loss, "kl_divergence": kl}
        out = {"loss_objective": objective.sum(), "loss_entropy": entropy_loss.sum(),
               "entropy": self.logged_entropy(entropy), "kl_divergence": kl.mean()}
        if self.use_critic:
            critic = self.critic_term(values, td)
            per_agent["loss_critic"] = critic
            out["loss_critic"] = critic.sum()
        return self.pack(out, per_agent, objective.shape[0])


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

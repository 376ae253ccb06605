"""``vanilla_ppo``: independent PPO for every agent (clip or KL-penalty loss), docs/behaviour.md#b25."""

from __future__ import annotations

from torchrl.objectives import ValueEstimators

from nip_core.trainers.objectives.ppo import ClipPpoLoss, KlPenaltyPpoLoss
from nip_core.trainers.registry import register_trainer
from nip_core.trainers.tensordict_rl import TensorDictRlTrainer

PPO_LOSSES = {"clip": ClipPpoLoss, "kl_penalty": KlPenaltyPpoLoss}


@register_trainer("vanilla_ppo")
class VanillaPpoTrainer(TensorDictRlTrainer):
    """PPO with a separate critic per agent (IPPO); ``ppo.loss_type`` picks the loss."""

    trainer_kind = "tensordict"
    needs_critic = True

    def _get_loss_module_and_gae(self):
        loss_class = PPO_LOSSES[self.hyper_params.ppo.loss_type]
        loss = loss_class(self.agents, self.hyper_params, self.message_key, use_critic=self.use_critic)
        loss.make_value_estimator(ValueEstimators.GAE, gamma=self.hyper_params.rl.gamma,
                                  lmbda=self.hyper_params.rl.lmbda)
        return loss, loss.value_estimator

"""``reinforce``: REINFORCE with reward-to-go, or with advantages and a critic (docs/behaviour.md#b26)."""

from __future__ import annotations

from torchrl.objectives import ValueEstimators

from nip_core.trainers.objectives.reinforce import ReinforceLoss, reward_to_go
from nip_core.trainers.registry import register_trainer
from nip_core.trainers.tensordict_rl import TensorDictRlTrainer


@register_trainer("reinforce")
class ReinforceTrainer(TensorDictRlTrainer):
    """Vanilla policy gradient; the critic is used only with ``reinforce.use_advantage_and_critic``."""

    trainer_kind = "tensordict"
    needs_critic = False
    critic_switch = "reinforce.use_advantage_and_critic"

    def _get_loss_module_and_gae(self):
        loss = ReinforceLoss(self.agents, self.hyper_params, self.message_key, use_critic=self.use_critic)
        if not self.use_critic:
            return loss, None
        loss.make_value_estimator(ValueEstimators.GAE, gamma=self.hyper_params.rl.gamma,
                                  lmbda=self.hyper_params.rl.lmbda)
        return loss, loss.value_estimator

    def _add_values_and_advantages(self, batch) -> None:
        super()._add_values_and_advantages(batch)
        batch.set(("agents", "reward_to_go"),
                  reward_to_go(batch["next", "agents", "reward"], batch["next", "agents", "done"],
                               self.hyper_params.rl.gamma))

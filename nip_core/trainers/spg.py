"""``spg``: Stackelberg policy gradient and its variants (docs/behaviour.md#b27)."""

from __future__ import annotations

from torch.nn.attention import SDPBackend
from torchrl.objectives import ValueEstimators

from nip_core.trainers.objectives.spg import SpgLoss
from nip_core.trainers.registry import register_trainer
from nip_core.trainers.tensordict_rl import TensorDictRlTrainer


@register_trainer("spg")
class SpgTrainer(TensorDictRlTrainer):
    """PPO-style training whose actor gradients are shaped by the Stackelberg structure."""

    trainer_kind = "tensordict"
    needs_critic = True

    # Hessian rows need double backward, which only the MATH attention kernel supports.
    attention_backends = [SDPBackend.MATH]

    def _get_loss_module_and_gae(self):
        loss = SpgLoss(self.agents, self.hyper_params, self.message_key,
                       self.protocol_handler.stackelberg_sequence, use_critic=self.use_critic)
        loss.make_value_estimator(ValueEstimators.GAE, gamma=self.hyper_params.rl.gamma,
                                  lmbda=self.hyper_params.rl.lmbda)
        return loss, loss.value_estimator

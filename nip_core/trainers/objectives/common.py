"""Pieces shared by the RL objectives: GAE with per-agent keys, advantages, critic loss."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from tensordict import TensorDictBase
from torch import Tensor
from torchrl.objectives.value import GAE

AGENT_KEYS = dict(advantage=("agents", "advantage"), value_target=("agents", "value_target"),
                  value=("agents", "value"), reward=("agents", "reward"), done=("agents", "done"),
                  terminated=("agents", "terminated"))


def make_gae(hyper_params) -> GAE:
    """TorchRL GAE reading/writing the per-agent keys (values are supplied, no value net)."""
    gae = GAE(gamma=hyper_params.rl.gamma, lmbda=hyper_params.rl.lmbda, value_network=None)
    gae.set_keys(**AGENT_KEYS)
    return gae


def normalized_advantage(td: TensorDictBase, normalize: bool) -> Tensor:
    """``(n, A)`` advantages, normalised per agent over the minibatch when asked (and n > 1)."""
    advantage = td["agents", "advantage"].squeeze(-1)
    if normalize and advantage.shape[0] > 1:
        advantage = (advantage - advantage.mean(0)) / advantage.std(0).clamp_min(1e-6)
    return advantage


def critic_loss(value: Tensor, td: TensorDictBase, loss_type: str, clip_value: float | None) -> Tensor:
    """Per-agent ``(A,)`` critic loss between ``value (n, A, 1)`` and the stored value target."""
    target = td["agents", "value_target"]
    losses = {"smooth_l1": F.smooth_l1_loss, "l1": F.l1_loss, "l2": F.mse_loss}
    fn = losses[loss_type]
    loss = fn(value, target, reduction="none")
    if clip_value is not None:
        old = td["agents", "value"]
        clipped = old + (value - old).clamp(-clip_value, clip_value)
        loss = torch.maximum(loss, fn(clipped, target, reduction="none"))
    return loss.squeeze(-1).mean(0)


def resolve_clip_value(hyper_params) -> float | None:
    """``rl.clip_value``: True -> ``ppo.clip_epsilon``, False -> None, a float -> itself."""
    value = hyper_params.rl.clip_value
    if value is True:
        return hyper_params.ppo.clip_epsilon
    if value is False:
        return None
    return float(value)

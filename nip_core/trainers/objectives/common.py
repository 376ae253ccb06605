"""Pieces shared by the RL objectives: the per-agent keys, advantages, critic loss.

The loss modules use them through :class:`~nip_core.trainers.objectives.base.NipLossModule`,
which passes its (renamable) keys; the defaults are the per-agent keys :data:`AGENT_KEYS`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from tensordict import TensorDictBase
from tensordict.utils import NestedKey
from torch import Tensor

AGENT_KEYS = dict(advantage=("agents", "advantage"), value_target=("agents", "value_target"),
                  value=("agents", "value"), reward=("agents", "reward"), done=("agents", "done"),
                  terminated=("agents", "terminated"))


def normalized_advantage(td: TensorDictBase, normalize: bool,
                         key: NestedKey = AGENT_KEYS["advantage"]) -> Tensor:
    """``(n, A)`` advantages (read at ``key``), normalised per agent over the minibatch when
    asked (and n > 1)."""
    advantage = td[key].squeeze(-1)
    if normalize and advantage.shape[0] > 1:
        advantage = (advantage - advantage.mean(0)) / advantage.std(0).clamp_min(1e-6)
    return advantage


CRITIC_LOSSES = {"smooth_l1": F.smooth_l1_loss, "l1": F.l1_loss, "l2": F.mse_loss}


def critic_loss(value: Tensor, td: TensorDictBase, loss_type: str, clip_value: float | None,
                target_key: NestedKey = AGENT_KEYS["value_target"],
                value_key: NestedKey = AGENT_KEYS["value"]) -> Tensor:
    """Per-agent ``(A,)`` critic loss between ``value (n, A, 1)`` and the stored value target.

    ``loss_type`` (``rl.loss_critic_type``) is one of :data:`CRITIC_LOSSES`; with
    ``clip_value`` the loss is the larger of the plain one and the one of the value clipped
    to ``clip_value`` around the stored (collection-time) value at ``value_key``.
    """
    if loss_type not in CRITIC_LOSSES:
        raise ValueError(f"rl.loss_critic_type: {loss_type!r} is not one of {sorted(CRITIC_LOSSES)}")
    target = td[target_key]
    fn = CRITIC_LOSSES[loss_type]
    loss = fn(value, target, reduction="none")
    if clip_value is not None:
        old = td[value_key]
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

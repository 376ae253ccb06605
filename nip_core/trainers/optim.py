"""The optimiser of the TensorDict trainers, chosen by ``rl.optimizer``.

Adam with ``eps=1e-5`` is the original library's (and the default). The others take
their usual arguments from ``rl``: ``betas`` (adam, adamw), ``momentum`` (sgd, rmsprop),
``weight_decay`` (all; decoupled for adamw) and ``optimizer_eps`` (all but sgd).
Arguments that an optimiser does not take are refused when the parameters are validated.
"""

from __future__ import annotations

from typing import Any

import torch


def build_optimizer(param_groups: list[dict[str, Any]], rl: Any) -> torch.optim.Optimizer | None:
    """The optimiser over ``param_groups`` (each with its own ``lr``), or None without any."""
    if not param_groups:
        return None
    name = rl.optimizer
    if name == "adam":
        return torch.optim.Adam(param_groups, betas=tuple(rl.betas), eps=rl.optimizer_eps, weight_decay=rl.weight_decay)
    if name == "adamw":
        return torch.optim.AdamW(param_groups, betas=tuple(rl.betas), eps=rl.optimizer_eps, weight_decay=rl.weight_decay)
    if name == "sgd":
        return torch.optim.SGD(param_groups, momentum=rl.momentum, weight_decay=rl.weight_decay)
    if name == "rmsprop":
        return torch.optim.RMSprop(param_groups, momentum=rl.momentum, eps=rl.optimizer_eps,
                                   weight_decay=rl.weight_decay)
    if name == "adagrad":
        return torch.optim.Adagrad(param_groups, eps=rl.optimizer_eps, weight_decay=rl.weight_decay)
    raise ValueError(f"rl.optimizer: unknown optimiser '{name}'")

"""Optimiser parameter groups from per-agent learning-rate factors (docs/behaviour.md#b21).

``agent_lr = lr * agent_lr_factor.{actor,critic}``; a body's lr is ``agent_lr *
body_lr_factor``; a body's GNN sub-module (when it has one) additionally gets
``gnn_lr_factor``; policy heads train at the agent's actor lr and value heads at its critic
lr. A shared body needs equal actor and critic factors. Groups whose lr is 0 are frozen
(``requires_grad = False``) rather than added.
"""

from __future__ import annotations

from torch import nn


class LrFactorError(ValueError):
    """Learning-rate factors that cannot be applied (e.g. unequal factors on a shared body)."""


def _factor(lr_factors, kind: str) -> float:
    return float(getattr(lr_factors, kind))


def body_groups(body: nn.Module, agent_name: str, agent_params, lr: float, kind: str,
                gnn_attr: str = "gnn", override_body_factor: bool = False) -> list[dict]:
    """Groups for one body at ``kind`` (``"actor"``/``"critic"``) factors: GNN part and the rest."""
    body_lr = lr * _factor(agent_params.agent_lr_factor, kind)
    if not override_body_factor:
        body_lr *= _factor(agent_params.body_lr_factor, kind)
    gnn_factors = getattr(agent_params, "gnn_lr_factor", None)
    gnn = getattr(body, gnn_attr, None)
    groups = []
    gnn_ids: set[int] = set()
    if isinstance(gnn, nn.Module) and gnn_factors is not None:
        gnn_params = list(gnn.parameters())
        gnn_ids = {id(p) for p in gnn_params}
        groups.append({"params": gnn_params, "lr": body_lr * _factor(gnn_factors, kind),
                       "name": f"{agent_name}.{kind}_body.gnn"})
    rest = [p for p in body.parameters() if id(p) not in gnn_ids]
    groups.append({"params": rest, "lr": body_lr, "name": f"{agent_name}.{kind}_body"})
    return groups


def shared_body_groups(body: nn.Module, agent_name: str, agent_params, lr: float,
                       override_body_factor: bool = False) -> list[dict]:
    """Groups for a body shared by actor and critic (the factors must agree)."""
    for field in ("agent_lr_factor", "body_lr_factor", "gnn_lr_factor"):
        factors = getattr(agent_params, field, None)
        if factors is not None and factors.actor != factors.critic:
            raise LrFactorError(f"agents.{agent_name}.{field}: actor ({factors.actor}) and critic "
                                f"({factors.critic}) factors must be equal with a shared body")
    return body_groups(body, agent_name, agent_params, lr, "actor", override_body_factor=override_body_factor)


def head_group(head: nn.Module, agent_name: str, agent_params, lr: float, kind: str, label: str) -> dict:
    return {"params": list(head.parameters()), "lr": lr * _factor(agent_params.agent_lr_factor, kind),
            "name": f"{agent_name}.{label}"}


def drop_frozen(groups: list[dict]) -> list[dict]:
    """Freeze (``requires_grad=False``) the parameters of lr-0 groups and drop empty/frozen groups."""
    kept = []
    for group in groups:
        if not group["params"]:
            continue
        if group["lr"] == 0:
            for p in group["params"]:
                p.requires_grad_(False)
            continue
        kept.append(group)
    return kept

"""Nyström approximation of an inverse-Hessian-vector product (Hataya & Yamada, 2023).

``ihvp ≈ (H + ρI)^{-1} v`` where ``H`` is the Hessian of ``follower_loss`` w.r.t. the
follower parameters and ``v`` the gradient of ``leader_loss`` w.r.t. the same parameters.
``H`` is replaced by its rank-``k`` Nyström approximation ``Rᵀ C⁻¹ R`` built from ``k``
randomly chosen rows ``R`` of the Hessian (``C`` = their ``k x k`` block), and the
Woodbury identity gives::

    (ρI + Rᵀ C⁻¹ R)⁻¹ v = v / ρ − Rᵀ (C + R Rᵀ / ρ)⁻¹ R v / ρ²

With ``k`` equal to the number of parameters this is exact. (The original added
``0.1 ρ I`` inside the solve, which makes even the full-rank product inexact; a
least-squares solve handles a singular ``C`` instead.)
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor


def _flat_grad(output: Tensor, params: Sequence[Tensor], create_graph: bool = False) -> Tensor:
    grads = torch.autograd.grad(output, params, retain_graph=True, create_graph=create_graph, allow_unused=True)
    return torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in zip(grads, params)])


def nystrom_ihvp(follower_loss: Tensor, leader_loss: Tensor, params: Sequence[Tensor], rank: int, rho: float,
                 generator: torch.Generator | None = None) -> list[Tensor]:
    """Approximate ``(H + ρI)^{-1} ∇ leader_loss`` for the follower ``params``.

    Parameters
    ----------
    follower_loss
        Scalar whose Hessian w.r.t. ``params`` is ``H`` (must be twice differentiable).
    leader_loss
        Scalar whose gradient w.r.t. ``params`` is ``v``.
    params
        The follower's parameters.
    rank
        Number of Hessian rows sampled (capped at the number of parameters).
    rho
        Damping ``ρ > 0``.
    generator
        Generator of the row choice (global RNG when ``None``).

    Returns
    -------
    list of Tensor
        The product, shaped like ``params``.
    """
    params = list(params)
    grad = _flat_grad(follower_loss, params, create_graph=True)
    num = grad.numel()
    k = min(rank, num)
    index = torch.randperm(num, generator=generator)[:k]
    rows = torch.stack([_flat_grad(grad[i], params) for i in index.tolist()])  # (k, P)
    v = _flat_grad(leader_loss, params).detach()
    block = rows[:, index]  # (k, k)
    system = block + rows @ rows.T / rho
    z = torch.linalg.lstsq(system.double(), (rows @ v).double().unsqueeze(-1)).solution.squeeze(-1).to(v.dtype)
    flat = v / rho - rows.T @ z / rho**2
    out, offset = [], 0
    for p in params:
        out.append(flat[offset:offset + p.numel()].reshape(p.shape))
        offset += p.numel()
    return out

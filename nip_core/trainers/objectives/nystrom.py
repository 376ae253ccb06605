"""Nyström approximation of an inverse-Hessian-vector product (Hataya & Yamada, 2023).

``ihvp ≈ (H + ρI)^{-1} v`` where ``H`` is the Hessian of ``follower_loss`` w.r.t. the
follower parameters and ``v`` the gradient of ``leader_loss`` w.r.t. the same parameters.
``H`` is replaced by its rank-``k`` Nyström approximation ``Rᵀ C⁻¹ R`` built from ``k``
randomly chosen rows ``R`` of the Hessian (``C`` = their ``k x k`` block), and the
Woodbury identity gives::

    (ρI + Rᵀ C⁻¹ R)⁻¹ v = v / ρ − Rᵀ (C + R Rᵀ / ρ)⁻¹ R v / ρ²

Hessians are often singular (low rank), and the sampled rows come from float32
autograd, so ``C`` carries float32 noise in the directions where it is singular. Solving
the system above as it stands (the original added ``0.1 ρ I`` inside the solve, which
makes even the full-rank product inexact; a plain least-squares solve keeps the noise
directions) amplifies that noise by up to ``1/ε``. Here ``C`` is symmetrised and
eigendecomposed in float64, eigenvalues below ``k · ε₃₂ · max|λ|`` are dropped (its
pseudo-inverse ``C⁺``), and with ``B = |Λ|^{-1/2} Uᵀ R`` and ``D = sign(Λ)``
(so ``Rᵀ C⁺ R = Bᵀ D B``, also for indefinite Hessians)::

    (ρI + Bᵀ D B)⁻¹ v = v / ρ − Bᵀ (D + B Bᵀ / ρ)⁻¹ B v / ρ²

The product is exact (to float32 accuracy) whenever the sampled rows span the Hessian's
row space, in particular at ``k = P``, whatever the Hessian's rank (see
``docs/behaviour.md#b28``). :func:`conjugate_gradient_ihvp` is the iterative alternative
(``spg.ihvp_variant = "conj_grad"``, ``spg.ihvp_num_iterations`` steps).
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
    flat = _woodbury_pseudo_inverse(rows, index, v, rho)
    return _unflatten(flat, params)


def _woodbury_pseudo_inverse(rows: Tensor, index: Tensor, v: Tensor, rho: float) -> Tensor:
    """``(ρI + Rᵀ C⁺ R)⁻¹ v`` with ``C = R[:, index]`` truncated to its reliable eigenvalues."""
    rows64, v64 = rows.detach().double(), v.double()
    block = rows64[:, index]
    evals, evecs = torch.linalg.eigh((block + block.T) / 2)  # (k,), (k, k)
    scale = evals.abs().max()
    tolerance = scale * len(index) * torch.finfo(rows.dtype).eps
    keep = evals.abs() > tolerance
    if not bool(keep.any()):  # the sampled Hessian is zero: (ρI)⁻¹ v
        return (v64 / rho).to(v.dtype)
    lam = evals[keep]
    b = (evecs[:, keep].T @ rows64) / lam.abs().sqrt().unsqueeze(-1)  # (r, P)
    system = torch.diag(torch.sign(lam)) + b @ b.T / rho  # (r, r)
    rhs = b @ v64
    try:
        z = torch.linalg.solve(system, rhs)
    except RuntimeError:  # ρI + H itself singular (indefinite H): the least-norm answer
        z = torch.linalg.lstsq(system, rhs.unsqueeze(-1)).solution.squeeze(-1)
    return (v64 / rho - b.T @ z / rho**2).to(v.dtype)


def _unflatten(flat: Tensor, params: Sequence[Tensor]) -> list[Tensor]:
    out, offset = [], 0
    for p in params:
        out.append(flat[offset:offset + p.numel()].reshape(p.shape))
        offset += p.numel()
    return out


def conjugate_gradient_ihvp(follower_loss: Tensor, leader_loss: Tensor, params: Sequence[Tensor],
                            num_iterations: int, rho: float, tolerance: float = 1e-10) -> list[Tensor]:
    """Solve ``(H + ρI) x = ∇ leader_loss`` by conjugate gradients with Hessian-vector products.

    Each of the at most ``num_iterations`` steps costs one Hessian-vector product (a
    second backward pass through ``follower_loss``'s gradient); the iteration stops early
    when the residual norm falls below ``tolerance · ‖v‖``. Exact after ``P`` steps in
    exact arithmetic when ``H + ρI`` is positive definite.
    """
    params = list(params)
    grad = _flat_grad(follower_loss, params, create_graph=True)
    v = _flat_grad(leader_loss, params).detach()

    def matvec(x: Tensor) -> Tensor:
        return _flat_grad(grad @ x, params).detach() + rho * x

    x = torch.zeros_like(v)
    residual = v.clone()
    direction = residual.clone()
    rs = residual @ residual
    stop = (tolerance * v.norm()) ** 2
    for _ in range(num_iterations):
        if rs <= stop:
            break
        product = matvec(direction)
        alpha = rs / (direction @ product)
        x = x + alpha * direction
        residual = residual - alpha * product
        rs_next = residual @ residual
        direction = residual + (rs_next / rs) * direction
        rs = rs_next
    return _unflatten(x, params)

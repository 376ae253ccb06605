"""Nyström IHVP against an exact solve of ``(H + ρI) x = v``."""

from __future__ import annotations

import pytest
import torch

from nip_core.trainers.objectives.nystrom import nystrom_ihvp


def quadratic_problem(dim: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(dim, dim, generator=g, dtype=torch.float64)
    hessian = a @ a.T + 0.5 * torch.eye(dim, dtype=torch.float64)
    b = torch.randn(dim, generator=g, dtype=torch.float64)
    c = torch.randn(dim, generator=g, dtype=torch.float64)
    w = torch.randn(dim, generator=g, dtype=torch.float64, requires_grad=True)
    # the follower's parameters are split in two tensors (a matrix and a vector)
    weight = w[:dim - 1].detach().clone().reshape(dim - 1, 1).requires_grad_(True)
    bias = w[dim - 1:].detach().clone().requires_grad_(True)

    def flat():
        return torch.cat([weight.reshape(-1), bias])

    follower = 0.5 * flat() @ hessian @ flat() + b @ flat()
    leader = c @ flat() + (flat() ** 3).sum()  # v = c + 3 w^2 at the current point
    v = c + 3 * flat().detach() ** 2
    return follower, leader, [weight, bias], hessian, v


@pytest.mark.parametrize("dim", [2, 3, 4])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_full_rank_nystrom_is_exact(dim, seed):
    follower, leader, params, hessian, v = quadratic_problem(dim, seed)
    rho = 0.1
    approx = nystrom_ihvp(follower, leader, params, rank=dim, rho=rho, generator=torch.Generator().manual_seed(seed))
    exact = torch.linalg.solve(hessian + rho * torch.eye(dim, dtype=torch.float64), v)
    assert approx[0].shape == params[0].shape and approx[1].shape == params[1].shape
    got = torch.cat([approx[0].reshape(-1), approx[1]])
    assert torch.allclose(got, exact, rtol=1e-6, atol=1e-8)


def test_low_rank_nystrom_is_exact_on_a_low_rank_hessian_and_differs_otherwise():
    dim, rho = 4, 0.1
    g = torch.Generator().manual_seed(3)
    u = torch.randn(dim, 2, generator=g, dtype=torch.float64)
    hessian = u @ u.T  # rank 2
    c = torch.randn(dim, generator=g, dtype=torch.float64)
    w = torch.randn(dim, generator=g, dtype=torch.float64, requires_grad=True)
    follower = 0.5 * w @ hessian @ w
    leader = c @ w
    approx = nystrom_ihvp(follower, leader, [w], rank=2, rho=rho, generator=torch.Generator().manual_seed(0))[0]
    exact = torch.linalg.solve(hessian + rho * torch.eye(dim, dtype=torch.float64), c)
    assert torch.allclose(approx, exact, rtol=1e-6, atol=1e-8)
    # rank 1 cannot capture a rank-2 Hessian
    rank1 = nystrom_ihvp(follower, leader, [w], rank=1, rho=rho, generator=torch.Generator().manual_seed(0))[0]
    assert not torch.allclose(rank1, exact, rtol=1e-3)

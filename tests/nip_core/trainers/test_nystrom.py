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


def low_rank_float32_problem(dim: int, rank: int, seed: int, indefinite: bool = False):
    """A float32 quadratic follower whose Hessian has exactly ``rank`` (the failing case)."""
    g = torch.Generator().manual_seed(1000 * dim + 10 * rank + seed)
    u = torch.randn(dim, rank, generator=g)
    signs = torch.where(torch.arange(rank) % 2 == 1, -1.0, 1.0) if indefinite else torch.ones(rank)
    hessian = u @ torch.diag(signs) @ u.T
    w = torch.randn(dim, generator=g, requires_grad=True)
    c = torch.randn(dim, generator=g)
    return 0.5 * w @ hessian @ w, c @ w + (w ** 3).sum(), [w], hessian.double(), (c + 3 * w.detach() ** 2).double()


def relative_error(got: torch.Tensor, exact: torch.Tensor) -> float:
    return float((got.double() - exact).norm() / exact.norm())


# Tolerance 1e-4 relative: the Hessian rows come from float32 autograd (ε ≈ 1.2e-7), and
# (H + ρI) with ρ = 0.1 has a condition number of at most ~10·‖H‖ here. The solve before
# the fix gave errors up to 1.6e-3 on these cases (2 of 87 above 1e-3).
@pytest.mark.parametrize("dim", [4, 9, 16])
def test_full_rank_sampling_matches_the_exact_solve_for_every_hessian_rank(dim):
    rho = 0.1
    for rank in range(1, dim + 1):
        for seed in range(3):
            follower, leader, params, hessian, v = low_rank_float32_problem(dim, rank, seed)
            got = nystrom_ihvp(follower, leader, params, rank=dim, rho=rho,
                               generator=torch.Generator().manual_seed(seed))[0]
            exact = torch.linalg.solve(hessian + rho * torch.eye(dim, dtype=torch.float64), v)
            assert relative_error(got, exact) < 1e-4, (dim, rank, seed)


@pytest.mark.parametrize("dim", [6, 12])
def test_rows_spanning_the_hessian_suffice_and_indefinite_hessians_work(dim):
    """k sampled rows reproduce a rank-r Hessian exactly once they span it (k ≥ r generically)."""
    rho = 0.5
    for rank in range(1, dim + 1, 2):
        for indefinite in (False, True):
            follower, leader, params, hessian, v = low_rank_float32_problem(dim, rank, 0, indefinite)
            k = min(dim, rank + 2)
            got = nystrom_ihvp(follower, leader, params, rank=k, rho=rho, generator=torch.Generator().manual_seed(1))[0]
            exact = torch.linalg.solve(hessian + rho * torch.eye(dim, dtype=torch.float64), v)
            assert relative_error(got, exact) < 1e-3, (dim, rank, indefinite)


def test_a_zero_hessian_gives_v_over_rho():
    w = torch.randn(5, requires_grad=True)
    c = torch.randn(5)
    got = nystrom_ihvp(0.0 * (w ** 2).sum(), c @ w, [w], rank=5, rho=0.25)[0]
    assert torch.allclose(got, c / 0.25)


@pytest.mark.parametrize("rank", [1, 4, 8])
def test_conjugate_gradients_converge_to_the_exact_solve(rank):
    from nip_core.trainers.objectives.nystrom import conjugate_gradient_ihvp

    dim, rho = 8, 0.1
    follower, leader, params, hessian, v = low_rank_float32_problem(dim, rank, 2)
    exact = torch.linalg.solve(hessian + rho * torch.eye(dim, dtype=torch.float64), v)
    one_step = conjugate_gradient_ihvp(follower, leader, params, num_iterations=1, rho=rho)[0]
    enough = conjugate_gradient_ihvp(follower, leader, params, num_iterations=3 * dim, rho=rho)[0]
    assert relative_error(enough, exact) < 1e-3
    assert relative_error(one_step, exact) > relative_error(enough, exact)  # ihvp_num_iterations matters


def test_neumann_variant_is_refused_with_the_field_named():
    from nip_core.parameters import HyperParameters
    from nip_core.parameters.base import ParameterError

    with pytest.raises(ParameterError, match="spg.ihvp_variant"):
        HyperParameters.from_dict({"scenario": "graph_isomorphism", "trainer": "spg", "dataset": "test",
                                    "spg": {"ihvp_variant": "neumann"}})
    hp = HyperParameters.from_dict({"scenario": "graph_isomorphism", "trainer": "spg", "dataset": "test",
                                    "spg": {"ihvp_variant": "conj_grad", "ihvp_num_iterations": 7}})
    assert hp.spg.ihvp_variant == "conj_grad" and hp.spg.ihvp_num_iterations == 7

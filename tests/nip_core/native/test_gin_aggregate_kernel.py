"""The C GIN aggregation kernel equals the masked activation and batched product it replaces (docs/performance.md)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nip_core.agents.mlp import FastTanh
from nip_core.scenarios.graph_isomorphism.agents.aggregation import (
    _composed,
    gin_aggregate,
    native_aggregation_applies,
)

REFERENCE_ACTIVATIONS = {FastTanh: torch.tanh, nn.ReLU: torch.relu}


def _inputs(repeats=3, graphs=13, N=11, d=16, seed=0):
    """``repeats`` bodies' copies of ``graphs`` graphs (as the stacked bodies run them), random
    adjacencies plus the identity (not symmetric, so that a transposition slip shows; weights
    other than 1), about a fifth of the nodes padding."""
    torch.manual_seed(seed)
    z = torch.randn(repeats * graphs, N, d, dtype=torch.float64) * 2
    edges = (torch.rand(graphs, N, N) < 0.3).double() * torch.rand(graphs, N, N, dtype=torch.float64) * 2
    adjacency = edges + torch.eye(N, dtype=torch.float64)
    mask = (torch.rand(graphs, N) < 0.8).double()
    return z, adjacency, mask


def _reference(z, adjacency, mask, activation):
    """Float64, with each body's copy of the adjacency and mask written out."""
    repeats = z.shape[0] // adjacency.shape[0]
    act = REFERENCE_ACTIVATIONS[type(activation)]
    return torch.bmm(adjacency.repeat(repeats, 1, 1), act(z * mask.repeat(repeats, 1).unsqueeze(-1)))


@pytest.mark.parametrize("activation", [FastTanh(), nn.ReLU()], ids=["tanh", "relu"])
@pytest.mark.parametrize("d", [16, 20], ids=["d16", "d20-partial-vector"])
# the adjacency read in place with the last block of rows overlapping the one before (11, 19), in
# whole blocks (8), and copied with zero rows below the graph's (5: fewer nodes than a block)
@pytest.mark.parametrize("N", [11, 19, 8, 5])
def test_forward_and_gradient_match_float64(activation, d, N):
    z64, adjacency, mask = _inputs(d=d, N=N)
    z = z64.float().requires_grad_()
    assert native_aggregation_applies(z, activation)
    y = gin_aggregate(z, adjacency.float(), mask.float(), activation)
    assert type(y.grad_fn).__name__ == "_NativeGinAggregateBackward" and y.shape == z.shape and y.dtype == z.dtype
    z64.requires_grad_()
    expected = _reference(z64, adjacency, mask, activation)
    torch.testing.assert_close(y.double(), expected, rtol=1e-5, atol=5e-6)
    # the float32 composition's own error is of the same size
    composed = _composed(z.detach(), adjacency.float(), mask.float(), activation)
    torch.testing.assert_close(composed.double(), expected, rtol=1e-5, atol=5e-6)
    grad = torch.randn(y.shape, dtype=torch.float64)
    (got,) = torch.autograd.grad(y, z, grad.float())
    (want,) = torch.autograd.grad(expected, z64, grad)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    # padding nodes get no gradient
    assert torch.all(got.view(3, 13, N, d)[:, mask == 0] == 0)


def test_each_graph_is_computed_as_if_alone():
    """A graph's result does not depend on the batch: computed with others or alone, bit for bit."""
    z64, adjacency, mask = _inputs(repeats=1)
    z = z64.float().requires_grad_()
    together = gin_aggregate(z, adjacency.float(), mask.float(), FastTanh())
    (grad_together,) = torch.autograd.grad(together.sum(), z)
    alone = gin_aggregate(z[5:6], adjacency[5:6].float(), mask[5:6].float(), FastTanh())
    (grad_alone,) = torch.autograd.grad(alone.sum(), z)
    assert torch.equal(together[5:6], alone) and torch.equal(grad_together[5:6], grad_alone[5:6])


def test_bfloat16_values_and_autocast():
    z64, adjacency, mask = _inputs()
    z = z64.bfloat16().requires_grad_()
    y = gin_aggregate(z, adjacency.bfloat16(), mask.bfloat16(), FastTanh())
    assert y.dtype == torch.bfloat16 and type(y.grad_fn).__name__ == "_NativeGinAggregateBackward"
    expected = _reference(z.detach().double(), adjacency, mask, FastTanh())
    torch.testing.assert_close(y.double(), expected, rtol=1e-2, atol=4e-2)  # bf16 output rounding
    (grad,) = torch.autograd.grad(y.float().sum(), z)
    assert grad.dtype == torch.bfloat16
    # a float32 adjacency with bf16 values is converted; under autocast float32 values run in
    # bf16, as the batched product would
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y_auto = gin_aggregate(z64.float(), adjacency.float(), mask.float(), FastTanh())
    assert y_auto.dtype == torch.bfloat16
    torch.testing.assert_close(y_auto.double(), expected, rtol=1e-2, atol=4e-2)


def test_second_derivatives_go_through_the_composition():
    """SPG differentiates the policy's gradient again."""
    z64, adjacency, mask = _inputs(repeats=2, graphs=4)
    z = z64.float().requires_grad_()
    y = gin_aggregate(z, adjacency.float(), mask.float(), FastTanh())
    (grad,) = torch.autograd.grad((y ** 2).sum(), z, create_graph=True)
    (got,) = torch.autograd.grad((grad ** 2).sum(), z)
    z64.requires_grad_()
    y64 = _reference(z64, adjacency, mask, FastTanh())
    (grad64,) = torch.autograd.grad((y64 ** 2).sum(), z64, create_graph=True)
    (want,) = torch.autograd.grad((grad64 ** 2).sum(), z64)
    # values up to ~1e4: float32 rounding, as the composition's own
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-6 * want.abs().max().item())


def test_other_activations_and_dtypes_run_the_composition_and_bad_shapes_are_refused():
    z64, adjacency, mask = _inputs()
    assert not native_aggregation_applies(z64, FastTanh())
    assert not native_aggregation_applies(z64.float(), nn.Sigmoid())
    y = gin_aggregate(z64.float().requires_grad_(), adjacency.float(), mask.float(), nn.Sigmoid())
    assert type(y.grad_fn).__name__ != "_NativeGinAggregateBackward"
    expected = torch.bmm(adjacency.repeat(3, 1, 1), torch.sigmoid(z64 * mask.repeat(3, 1).unsqueeze(-1)))
    torch.testing.assert_close(y.double(), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gin_aggregate(z64, adjacency, mask, FastTanh()),
                               _reference(z64, adjacency, mask, FastTanh()))
    with pytest.raises(ValueError, match=r"gin_aggregate: z \(39, 11, 16\) needs .* got \(12, 11, 11\) and \(13, 11\)"):
        gin_aggregate(z64.float(), adjacency[:12].float(), mask.float(), FastTanh())
    with pytest.raises(ValueError, match="a multiple of Gd"):
        gin_aggregate(z64[:20].float(), adjacency.float(), mask.float(), FastTanh())


def test_tanh_at_extreme_values_and_nan():
    """lanes.h's sigmoid under the tanh, 1 - 2 sigmoid(-2z): within 2e-7 of float64's tanh from -1e4 to
    1e4 (exactly +-1 far out), and a NaN stays NaN (in its feature: the sums over nodes add it)."""
    values = torch.tensor([-1e4, -100, -44, -40, -9.5, -1, -1e-3, -1e-30, 0, 3e-8, 0.5, 8, 43.3, 44, 100, 1e4])
    z = values.view(1, 1, 16).repeat(1, 3, 1).float()
    z[0, 2, 5] = float("nan")
    adjacency, mask = torch.eye(3).unsqueeze(0), torch.ones(1, 3)
    assert native_aggregation_applies(z, FastTanh())
    y = gin_aggregate(z, adjacency, mask, FastTanh())
    expected = torch.tanh(z.double())
    assert torch.isnan(y[0, :, 5]).all() and torch.isnan(y).sum() == 3  # 0 x NaN: in every node's sum
    finite = ~torch.isnan(expected)
    finite[:, :, 5] = False
    assert (y.double()[finite] - expected[finite]).abs().max() <= 2e-7
    assert (y[0, 0, [0, 1, -2, -1]] == torch.tensor([-1.0, -1.0, 1.0, 1.0])).all()

"""The C two-layer MLP kernel equals the batched products it replaces (docs/performance.md)."""

from __future__ import annotations

import pytest
import torch

from nip_core.scenarios.graph_isomorphism.agents import fused_mlp
from nip_core.scenarios.graph_isomorphism.agents.fused_mlp import (
    _composed,
    folded_tanh_mlp,
    native_mlp_applies,
    stacked_two_layer_mlp,
)
from nip_core.utils import cpu as cpu_module


def _inputs(K=2, M=150, din=16, dh=24, dout=8, dtype=torch.float32, seed=0):
    """M = 150 rows: not a multiple of the 16 lanes nor of a group of 8 blocks."""
    torch.manual_seed(seed)
    x = torch.randn(K, M, din, dtype=torch.float64).to(dtype).requires_grad_()
    weights = [(torch.randn(*shape, dtype=torch.float64) * 0.4).float().requires_grad_()
               for shape in ((K, din, dh), (K, dh), (K, dh, dout), (K, dout))]
    return x, weights


def _float64(tensors):
    return [t.detach().double().requires_grad_() for t in tensors]


@pytest.mark.parametrize("rows", [150, 40, 5])
@pytest.mark.parametrize("activation", ["sigmoid", "relu", "tanh"])
def test_forward_and_all_five_gradients_match_float64(activation, rows):
    """150 rows: 10 blocks of 16, the last partly filled; 40: 3 blocks, so with AVX-512 (two blocks
    per pass) the last pass has a block past the end; 5: less than one block."""
    x, (w1, b1, w2, b2) = _inputs(M=rows)
    assert native_mlp_applies(x, activation, (16, 24, 8))
    y = stacked_two_layer_mlp(x, w1, b1, activation, w2, b2)
    assert type(y.grad_fn).__name__ == "_NativeStackedMlpBackward" and y.shape == (2, rows, 8)
    ref_inputs = _float64([x, w1, b1, w2, b2])
    x64, w164, b164, w264, b264 = ref_inputs
    expected = _composed(x64, w164, b164, activation, w264, b264)
    torch.testing.assert_close(y.double(), expected, rtol=1e-5, atol=1e-6)
    grad = torch.randn(y.shape, dtype=torch.float64)
    got = torch.autograd.grad(y, [x, w1, b1, w2, b2], grad.float())
    want = torch.autograd.grad(expected, ref_inputs, grad)
    for g, w in zip(got, want):
        assert g.dtype == torch.float32
        torch.testing.assert_close(g.double(), w, rtol=1e-5, atol=1e-5)


def test_each_stacked_mlp_is_computed_as_if_alone():
    """Body k's result does not depend on the other bodies: stacked and separate bodies agree bit for bit."""
    x, weights = _inputs(K=3, M=40)
    together = stacked_two_layer_mlp(x, *weights[:2], "sigmoid", *weights[2:])
    grads_together = torch.autograd.grad(together.sum(), [x, *weights])
    alone = stacked_two_layer_mlp(x[1:2], *(w[1:2] for w in weights[:2]), "sigmoid", *(w[1:2] for w in weights[2:]))
    grads_alone = torch.autograd.grad(alone.sum(), [x, *weights])
    assert torch.equal(together[1:2], alone)
    for g_together, g_alone in zip(grads_together, grads_alone):
        assert torch.equal(g_together[1:2], g_alone[1:2])


@pytest.mark.parametrize("native_bf16", [True, False])
def test_bfloat16_rows_and_cpu_autocast_take_the_kernel(monkeypatch, native_bf16):
    # whatever the CPU says of bf16 (patched where the rule was read, so that a rule read again
    # fails on every machine, not only on one with native bf16)
    monkeypatch.setattr(cpu_module, "cpu_has_native_bf16", lambda: native_bf16)
    monkeypatch.setattr(fused_mlp, "cpu_has_native_bf16", lambda: native_bf16, raising=False)
    x, weights = _inputs()
    x_bf16 = x.detach().bfloat16().requires_grad_()
    y = stacked_two_layer_mlp(x_bf16, *weights[:2], "relu", *weights[2:])
    assert y.dtype == torch.bfloat16 and type(y.grad_fn).__name__ == "_NativeStackedMlpBackward"
    ref_inputs = _float64([x_bf16, *weights])
    expected = _composed(ref_inputs[0], *ref_inputs[1:3], "relu", *ref_inputs[3:])
    torch.testing.assert_close(y.double(), expected, rtol=1e-2, atol=1e-2)  # bf16 output rounding
    (grad_x, grad_w1) = torch.autograd.grad(y.float().sum(), [x_bf16, weights[0]])
    assert grad_x.dtype == torch.bfloat16 and grad_w1.dtype == torch.float32
    # under autocast, on any CPU: the kernel, on the rows and weights rounded to bf16 as autocast
    # rounds a product's operands
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = stacked_two_layer_mlp(x, *weights[:2], "relu", *weights[2:])
    assert y.dtype == torch.bfloat16 and type(y.grad_fn).__name__ == "_NativeStackedMlpBackward"
    torch.testing.assert_close(y.double(), expected, rtol=3e-2, atol=3e-2)
    rounded = [t.detach().bfloat16() for t in (x, *weights)]
    assert torch.equal(y, stacked_two_layer_mlp(rounded[0], *rounded[1:3], "relu", *rounded[3:]))
    grads = torch.autograd.grad(y.float().sum(), weights)
    assert all(g.dtype == torch.float32 and torch.equal(g, g.bfloat16().float()) for g in grads)


def test_folded_tanh_is_tanh():
    x, (w1, b1, w2, b2) = _inputs()
    out = folded_tanh_mlp(x, w1, b1, w2, b2)
    expected = torch.tanh(x.double() @ w1.double() + b1.double().unsqueeze(1)) @ w2.double() + b2.double().unsqueeze(1)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)
    no_bias = folded_tanh_mlp(x, w1, None, w2, None)
    torch.testing.assert_close(no_bias.double(), torch.tanh(x.double() @ w1.double()) @ w2.double(), rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("rows", [None, torch.tensor([0, 1, 2, 5, 6, 11, 12, 13, 19])])
def test_second_derivatives_go_through_the_composition(rows):
    """SPG differentiates the policy's gradient again (with ``rows``: of the listed rows alone)."""
    x, weights = _inputs(M=20)
    y = stacked_two_layer_mlp(x, *weights[:2], "sigmoid", *weights[2:], rows=rows)
    (grad_x,) = torch.autograd.grad((y ** 2).sum(), x, create_graph=True)
    got = torch.autograd.grad((grad_x ** 2).sum(), weights)
    ref_inputs = _float64([x if rows is None else x[:, rows], *weights])
    y64 = _composed(ref_inputs[0], *ref_inputs[1:3], "sigmoid", *ref_inputs[3:])
    (grad_x64,) = torch.autograd.grad((y64 ** 2).sum(), ref_inputs[0], create_graph=True)
    want = torch.autograd.grad((grad_x64 ** 2).sum(), ref_inputs[1:])
    for g, w in zip(got, want):
        torch.testing.assert_close(g.double(), w, rtol=1e-4, atol=1e-5)


def test_sizes_the_kernel_does_not_take_run_the_products():
    x, weights = _inputs(din=6)
    assert not native_mlp_applies(x, "relu", (6, 24, 8))
    y = stacked_two_layer_mlp(x, *weights[:2], "relu", *weights[2:])
    assert type(y.grad_fn).__name__ != "_NativeStackedMlpBackward"
    assert not native_mlp_applies(x.double(), "relu", (16, 24, 8))
    assert not native_mlp_applies(x, "gelu", (16, 24, 8))


def test_sigmoid_at_extreme_values_and_nan():
    """lanes.h's sigmoid, through the kernel with identity weights: within 2e-7 (relative) of
    float64's from -80 to 1e4, 2.35e-38 at most (not the subnormal it is) below, and a NaN stays
    NaN (in its row: the second layer adds it to every output)."""
    values = torch.tensor([-1e4, -200, -90, -86, -80, -30, -9.5, -1, -1e-3, 0, 3e-8, 0.5, 8, 17, 90, 1e4])
    rows = torch.zeros(len(values), 8)
    rows[:, 3] = values  # one value per row: the identity's zeros never meet it
    rows[5, 6] = float("nan")
    x = rows.unsqueeze(0)
    eye, zeros = torch.eye(8).unsqueeze(0), torch.zeros(1, 8)
    assert native_mlp_applies(x, "sigmoid", (8, 8, 8))
    y = stacked_two_layer_mlp(x, eye, zeros, "sigmoid", eye, zeros)
    assert type(y.grad_fn).__name__ != "AddBackward0"
    expected = torch.sigmoid(rows.double())
    assert torch.isnan(y[0, 5]).all() and torch.isnan(y).sum() == 8  # the second layer spreads it over the row
    others = torch.arange(len(values)) != 5
    assert (y[0, others, :3] == 0.5).all()  # sigmoid(0), the zeros of the identity adding nothing
    column, reference = y[0, others, 3].double(), expected[others, 3]
    normal = reference > 2.36e-38  # above what z is clamped to
    assert ((column[normal] - reference[normal]).abs() / reference[normal]).max() <= 2e-7
    assert (column[~normal] <= 2.36e-38).all() and (column[~normal] >= 0).all()
    assert column[-1] == 1.0 and column[-2] == 1.0


@pytest.mark.parametrize("activation", ["sigmoid", "relu"])
def test_bfloat16_rows_give_the_float32_results_rounded(activation):
    """bf16 rows in, float32 arithmetic: the float32 kernel's numbers on the same values, rounded to
    nearest even as torch rounds (rows converted a chunk at a time; 150 rows end in a partial block);
    the weight gradients, summed over rows converted to float32, equal the float32 kernel's."""
    x, weights = _inputs()
    x_bf16 = x.detach().bfloat16().requires_grad_()
    wide = x_bf16.detach().float().requires_grad_()
    y = stacked_two_layer_mlp(x_bf16, *weights[:2], activation, *weights[2:])
    y_wide = stacked_two_layer_mlp(wide, *weights[:2], activation, *weights[2:])
    assert y.dtype == torch.bfloat16 and torch.equal(y, y_wide.bfloat16())
    grad = torch.randn(y.shape).bfloat16()
    got, want = torch.autograd.grad(y, [x_bf16, *weights], grad), torch.autograd.grad(y_wide, [wide, *weights],
                                                                                     grad.float())
    assert got[0].dtype == torch.bfloat16 and torch.equal(got[0], want[0].bfloat16())
    assert all(g.dtype == torch.float32 and torch.equal(g, w) for g, w in zip(got[1:], want[1:]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("activation", ["sigmoid", "relu"])
def test_rows_are_those_of_the_kernel_on_the_rows_alone_and_the_others_zero(activation, dtype):
    """``rows``: the kernel computes the listed rows as it computes a tensor of those rows alone
    (bit for bit, weight gradients included: the same rows in the same order), writes 0 to every
    other row and passes those rows no gradient. 150 rows, 97 of them listed (ends in a partial
    block; gaps of several rows, as a GI graph's padding nodes)."""
    x, weights = _inputs(dtype=dtype)
    x = x.detach().requires_grad_()
    keep = torch.ones(150, dtype=torch.bool)
    keep[torch.randperm(150, generator=torch.Generator().manual_seed(3))[:53]] = False
    rows = keep.nonzero().squeeze(1)
    y = stacked_two_layer_mlp(x, *weights[:2], activation, *weights[2:], rows=rows)
    assert type(y.grad_fn).__name__ == "_NativeStackedMlpBackward" and y.shape == (2, 150, 8)
    alone_x = x.detach()[:, rows].requires_grad_()
    alone = stacked_two_layer_mlp(alone_x, *weights[:2], activation, *weights[2:])
    assert torch.equal(y[:, rows], alone) and (y[:, ~keep] == 0).all()
    grad = torch.randn(y.shape).to(dtype)
    got = torch.autograd.grad(y, [x, *weights], grad)
    want = torch.autograd.grad(alone, [alone_x, *weights], grad[:, rows])
    assert torch.equal(got[0][:, rows], want[0]) and (got[0][:, ~keep] == 0).all()
    assert all(torch.equal(g, w) for g, w in zip(got[1:], want[1:]))
    # the batched products (a size the kernel does not take) give the same function
    x6, weights6 = _inputs(din=6)
    y6 = stacked_two_layer_mlp(x6, *weights6[:2], activation, *weights6[2:], rows=rows)
    assert type(y6.grad_fn).__name__ != "_NativeStackedMlpBackward" and (y6[:, ~keep] == 0).all()
    torch.testing.assert_close(y6[:, rows], stacked_two_layer_mlp(x6[:, rows], *weights6[:2], activation, *weights6[2:]))
    (grad_x6,) = torch.autograd.grad(y6.sum(), x6)
    assert (grad_x6[:, ~keep] == 0).all() and (grad_x6[:, rows] != 0).any()


def test_weights_are_read_where_they_lie():
    """Transposed weights (as the GI bodies pass ``nn.Linear`` weights, stacked) and weights with a
    gap between bodies: the results of their contiguous copies, bit for bit; the weight gradients
    come back contiguous, in the weights' shapes."""
    x, (w1, b1, w2, b2) = _inputs(dh=24, dout=16)
    w1_t = w1.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_()  # (K, din, dh), strides of a .t()
    w2_wide = torch.zeros(2, 24, 32)
    w2_wide[:, :, :16] = w2.detach()
    w2_gap = w2_wide[:, :, :16].requires_grad_()  # a view with rows of 32
    assert not w1_t.is_contiguous() and not w2_gap.is_contiguous()
    y = stacked_two_layer_mlp(x, w1_t, b1, "tanh", w2_gap, b2)
    y_copies = stacked_two_layer_mlp(x, w1, b1, "tanh", w2, b2)
    assert type(y.grad_fn).__name__ == "_NativeStackedMlpBackward" and torch.equal(y, y_copies)
    grad = torch.randn(y.shape)
    got = torch.autograd.grad(y, [x, w1_t, b1, w2_gap, b2], grad)
    want = torch.autograd.grad(y_copies, [x, w1, b1, w2, b2], grad)
    assert all(torch.equal(g, w) and g.shape == w.shape for g, w in zip(got, want))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("activation", ["sigmoid", "relu", "tanh"])
@pytest.mark.parametrize("M", [150, 40])
def test_kept_activations_give_the_gradients_of_the_recomputed_ones_bit_for_bit(M, activation, dtype, monkeypatch):
    """With a backward pass to come the forward pass keeps the activations and the backward pass
    reads them; without (``keep_hidden`` False) it computes them again: the same numbers either way,
    with a row list too (M = 40: with AVX-512 a block past the end in the kept layout)."""
    x, weights = _inputs(M=M, dtype=dtype)
    assert stacked_two_layer_mlp(x, weights[0], weights[1], activation, weights[2], weights[3]).grad_fn is not None
    for rows in (None, torch.arange(1, M, 3)):
        grad_y = torch.randn(2, M, 8).to(dtype)
        results = []
        for keep in (True, False):
            y = fused_mlp._NativeStackedMlp.apply(x, *weights[:2], *weights[2:], activation, rows, keep)
            results.append((y, torch.autograd.grad(y, [x, *weights], grad_y)))
        (y_kept, kept), (y_again, again) = results
        assert torch.equal(y_kept, y_again)
        for a, b in zip(kept, again):
            assert torch.equal(a, b)
    calls = []
    real = fused_mlp._NativeStackedMlp.apply
    monkeypatch.setattr(fused_mlp._NativeStackedMlp, "apply", lambda *args: calls.append(args[-1]) or real(*args))
    stacked_two_layer_mlp(x, weights[0], weights[1], activation, weights[2], weights[3])
    with torch.no_grad():  # no backward pass to come: nothing kept
        stacked_two_layer_mlp(x, weights[0], weights[1], activation, weights[2], weights[3])
    assert calls == [True, False]


def test_the_kernel_sets_the_rows_it_does_not_compute_to_zero_whatever_was_there():
    """y and the input gradient are allocated without zeroing: the kernel writes 0 at the rows left
    out (before the first row, between rows and after the last)."""
    x, (w1, b1, w2, b2) = _inputs(M=150)
    rows = torch.tensor([3, 4, 9, 40, 41, 42, 100, 148])
    kernel, M = fused_mlp._kernel(), 150
    y = torch.full((2, M, 8), float("nan"))
    args = (2, M, 16, 24, 8, x.data_ptr(), 0, w1.data_ptr(), b1.data_ptr(), fused_mlp.ACTIVATIONS["tanh"])
    assert kernel.nip_mlp2_forward(*args, w2.data_ptr(), b2.data_ptr(), y.data_ptr(), *fused_mlp._row_list(rows),
                                   fused_mlp._strides(w1, w2), None) == 0
    others = torch.ones(M, dtype=torch.bool).index_fill_(0, rows, False)
    assert (y[:, others] == 0).all() and not y[:, rows].isnan().any()
    expected = stacked_two_layer_mlp(x.detach()[:, rows], w1.detach(), b1.detach(), "tanh", w2.detach(), b2.detach())
    assert torch.equal(y[:, rows], expected)
    gy = torch.randn(2, M, 8)
    gx = torch.full((2, M, 16), float("nan"))
    grads = [torch.empty(t.shape) for t in (w1, b1, w2, b2)]
    assert kernel.nip_mlp2_backward(*args, w2.data_ptr(), gy.data_ptr(), gx.data_ptr(),
                                    *(g.data_ptr() for g in grads), *fused_mlp._row_list(rows),
                                    fused_mlp._strides(w1, w2), None) == 0
    assert (gx[:, others] == 0).all() and not gx[:, rows].isnan().any()

"""The C layer-norm kernel equals F.layer_norm and the per-body affine it replaces (docs/performance.md)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nip_core.scenarios.graph_isomorphism.agents.layer_norm import (
    layer_norm,
    native_layer_norm_applies,
    stacked_layer_norm,
)

EPS = 1e-5


def _inputs(K=2, M=150, d=16, seed=0):
    """M = 150 rows: not a multiple of the kernel's 16 lanes; rows far from mean 0 and variance 1."""
    torch.manual_seed(seed)
    x = torch.randn(K, M, d, dtype=torch.float64) * 3 + 1
    weight, bias = (torch.randn(K, d, dtype=torch.float64) for _ in range(2))
    return x, weight, bias


def _reference(x, weight, bias):
    mean = x.mean(-1, keepdim=True)
    out = (x - mean) / torch.sqrt(((x - mean) ** 2).mean(-1, keepdim=True) + EPS)
    return out if weight is None else out * weight.unsqueeze(1) + bias.unsqueeze(1)


@pytest.mark.parametrize("affine", [True, False], ids=["affine", "no-affine"])
def test_forward_and_every_gradient_match_float64(affine):
    x64, w64, b64 = _inputs()
    x = x64.float().requires_grad_()
    weight, bias = (w64.float().requires_grad_(), b64.float().requires_grad_()) if affine else (None, None)
    assert native_layer_norm_applies(x, weight)
    y = stacked_layer_norm(x, weight, bias, EPS)
    assert type(y.grad_fn).__name__ == "_NativeLayerNormBackward" and y.dtype == torch.float32
    inputs = [x, weight, bias] if affine else [x]
    inputs64 = [t.detach().double().requires_grad_() for t in inputs]
    expected = _reference(*inputs64) if affine else _reference(inputs64[0], None, None)
    torch.testing.assert_close(y.double(), expected, rtol=1e-5, atol=2e-6)
    grad = torch.randn(y.shape, dtype=torch.float64)
    got = torch.autograd.grad(y, inputs, grad.float())
    want = torch.autograd.grad(expected, inputs64, grad)
    for g, w in zip(got, want):
        torch.testing.assert_close(g.double(), w, rtol=1e-5, atol=1e-5)


def test_each_body_and_row_is_normalised_as_if_alone():
    """Stacked and single bodies agree bit for bit, whatever the batch."""
    x64, w64, b64 = _inputs(K=3, M=40)
    x, weight, bias = (t.float().requires_grad_() for t in (x64, w64, b64))
    together = stacked_layer_norm(x, weight, bias, EPS)
    grads_together = torch.autograd.grad((together * torch.arange(16.0)).sum(), [x, weight, bias])
    alone = stacked_layer_norm(x[1:2, 7:9], weight[1:2], bias[1:2], EPS)
    assert torch.equal(together[1:2, 7:9], alone)
    alone = stacked_layer_norm(x[1:2], weight[1:2], bias[1:2], EPS)
    grads_alone = torch.autograd.grad((alone * torch.arange(16.0)).sum(), [x, weight, bias])
    for g_together, g_alone in zip(grads_together, grads_alone):
        assert torch.equal(g_together[1:2], g_alone[1:2])


def test_bfloat16_rows_with_float32_weights_give_float32_as_under_autocast():
    x64, w64, b64 = _inputs()
    x = x64.bfloat16().requires_grad_()
    y = stacked_layer_norm(x, w64.float(), b64.float(), EPS)
    assert y.dtype == torch.float32 and type(y.grad_fn).__name__ == "_NativeLayerNormBackward"
    # float32 throughout, from the bf16 values: closer than F.layer_norm, which rounds to bf16 first
    torch.testing.assert_close(y.double(), _reference(x.detach().double(), w64, b64), rtol=1e-5, atol=2e-6)
    (grad,) = torch.autograd.grad(y.sum(), x)
    assert grad.dtype == torch.bfloat16
    y_plain = stacked_layer_norm(x, None, None, EPS)
    assert y_plain.dtype == torch.bfloat16


def test_second_derivatives_go_through_the_composition():
    x64, w64, b64 = _inputs(M=20)
    inputs = [t.float().requires_grad_() for t in (x64, w64, b64)]
    y = stacked_layer_norm(*inputs, EPS)
    (grad_x,) = torch.autograd.grad((y ** 3).sum(), inputs[0], create_graph=True)
    got = torch.autograd.grad((grad_x ** 2).sum(), inputs)
    inputs64 = [t.detach().double().requires_grad_() for t in inputs]
    y64 = _reference(*inputs64)
    (grad_x64,) = torch.autograd.grad((y64 ** 3).sum(), inputs64[0], create_graph=True)
    want = torch.autograd.grad((grad_x64 ** 2).sum(), inputs64)
    for g, w in zip(got, want):
        torch.testing.assert_close(g.double(), w, rtol=1e-4, atol=1e-6 * w.abs().max().item())


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_a_single_bodys_layer_norm_is_nn_layer_norm(bias):
    torch.manual_seed(1)
    norm = nn.LayerNorm(16, bias=bias)
    with torch.no_grad():
        norm.weight.normal_()
        if bias:
            norm.bias.normal_()
    x = torch.randn(5, 24, 16) * 2
    torch.testing.assert_close(layer_norm(norm, x), norm(x), rtol=1e-5, atol=1e-6)
    plain = nn.LayerNorm(16, elementwise_affine=False)
    torch.testing.assert_close(layer_norm(plain, x), plain(x), rtol=1e-5, atol=1e-6)


def test_other_dtypes_run_the_composition_and_a_bias_needs_a_weight():
    x64, w64, b64 = _inputs()
    assert not native_layer_norm_applies(x64, w64)
    y = stacked_layer_norm(x64.requires_grad_(), w64, b64, EPS)
    assert type(y.grad_fn).__name__ != "_NativeLayerNormBackward"
    torch.testing.assert_close(y, _reference(x64, w64, b64))
    with pytest.raises(ValueError, match="a bias needs a weight"):
        stacked_layer_norm(x64.float(), None, b64.float(), EPS)

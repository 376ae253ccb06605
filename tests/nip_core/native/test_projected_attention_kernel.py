"""The attention kernel with the in-projection inside it (``projected_self_attention``) equals the
in-projection as a batched product followed by the attention, forward, backward and twice."""

from __future__ import annotations

import pytest
import torch

from nip_core.scenarios.graph_isomorphism.agents.attention import (
    _composed_self_attention,
    _projected,
    native_projected_attention_applies,
    projected_self_attention,
    self_attention,
)

H, DH, D_IN = 4, 4, 16


def _inputs(K=2, B=26, L=24, seed=0):
    """``K`` bodies' in-projections, their ``K B`` token sequences (B = 26: not a multiple of the
    kernel's 16 lanes, so each body ends in a partial block) and a ``(B, 1, L, L)`` additive mask."""
    torch.manual_seed(seed)
    x = torch.randn(K * B, L, D_IN, requires_grad=True)
    weight = (0.3 * torch.randn(K, 3 * H * DH, D_IN)).requires_grad_()
    bias = (0.1 * torch.randn(K, 3 * H * DH)).requires_grad_()
    blocked = torch.rand(B, L, L) < 0.4
    blocked[..., :2] = False  # every query sees the two pooled tokens
    mask = torch.zeros(B, 1, L, L).masked_fill(blocked.unsqueeze(1), float("-inf"))
    return x, weight, bias, mask


def _float64(*tensors):
    return [t.detach().double().requires_grad_() for t in tensors]


@pytest.mark.parametrize("queries", [None, 2])
def test_forward_and_every_gradient_match_the_projection_then_the_attention_in_float64(queries):
    x, weight, bias, mask = _inputs()
    assert native_projected_attention_applies(x, weight, mask, 0.0)
    out = projected_self_attention(x, weight, bias, mask, H, 0.0, queries)
    assert type(out.grad_fn).__name__ == "_NativeProjectedSelfAttentionBackward"
    assert out.shape == (52, 24 if queries is None else queries, H * DH)
    reference_inputs = _float64(x, weight, bias)
    expected = _composed_self_attention(_projected(*reference_inputs), mask.double(), H, 0.0, queries)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=3e-6)
    grad = torch.randn(out.shape)
    got = torch.autograd.grad(out, (x, weight, bias), grad)
    want = torch.autograd.grad(expected, reference_inputs, grad.double())
    for name, g, w in zip(("x", "weight", "bias"), got, want):
        torch.testing.assert_close(g.double(), w, rtol=1e-5, atol=5e-5, msg=lambda m: f"{name}: {m}")
    if queries is not None:  # the other tokens' queries take no part, whatever their values
        changed = x.detach().clone()
        changed[:, queries:] += 1.0
        moved = projected_self_attention(changed, weight, bias, mask, H, 0.0, queries)
        assert not torch.equal(moved, out)  # they are keys and values still


def test_each_body_is_computed_as_if_alone_bit_for_bit():
    """Blocks never straddle two bodies, so body k of a stacked call equals a call with its weights
    alone, forward and every gradient, bit for bit (the stacked and single GI bodies agree)."""
    x, weight, bias, mask = _inputs(K=3, B=21)
    out = projected_self_attention(x, weight, bias, mask, H, 0.0)
    grad = torch.randn(out.shape)
    gx, gw, gb = torch.autograd.grad(out, (x, weight, bias), grad)
    for k in range(3):
        rows = slice(21 * k, 21 * (k + 1))
        xk = x[rows].detach().requires_grad_()
        wk, bk = weight[k:k + 1].detach().requires_grad_(), bias[k:k + 1].detach().requires_grad_()
        alone = projected_self_attention(xk, wk, bk, mask, H, 0.0)
        assert torch.equal(alone, out[rows])
        ax, aw, ab = torch.autograd.grad(alone, (xk, wk, bk), grad[rows])
        assert torch.equal(ax, gx[rows]) and torch.equal(aw[0], gw[k]) and torch.equal(ab[0], gb[k])


def test_second_derivatives_go_through_the_composition():
    """SPG differentiates the policy's gradient again."""
    x, weight, bias, mask = _inputs(K=2, B=3, L=6)
    out = projected_self_attention(x, weight, bias, mask, H, 0.0)
    first = torch.autograd.grad((out ** 2).sum(), (x, weight), create_graph=True)
    second = torch.autograd.grad(sum((g ** 2).sum() for g in first), (x, weight, bias))
    reference_inputs = _float64(x, weight, bias)
    ref = _composed_self_attention(_projected(*reference_inputs), mask.double(), H, 0.0)
    ref_first = torch.autograd.grad((ref ** 2).sum(), reference_inputs[:2], create_graph=True)
    ref_second = torch.autograd.grad(sum((g ** 2).sum() for g in ref_first), reference_inputs)
    for got, want in zip(second, ref_second):  # float32 against float64: values up to ~1e5 here
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=2e-6 * want.abs().max().item())


def test_elsewhere_the_projection_is_a_batched_product_then_the_attention_as_before():
    """bf16 autocast, dropout, widths the kernel does not take: the in-projection as ``baddbmm`` and
    then :func:`self_attention`, the numbers of the code before the kernel took the projection in."""
    x, weight, bias, mask = _inputs(B=5)
    before = lambda: self_attention(torch.baddbmm(bias.unsqueeze(1), x.reshape(2, -1, D_IN), weight.transpose(1, 2))
                                    .view(10, 24, 3 * H * DH), mask, H, 0.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not native_projected_attention_applies(x, weight, mask, 0.0)
        out = projected_self_attention(x, weight, bias, mask, H, 0.0)
        assert out.dtype == torch.bfloat16 and torch.equal(out, before())
    assert not native_projected_attention_applies(x, weight, mask, 0.1)
    assert not native_projected_attention_applies(x.double(), weight.double(), mask, 0.0)
    narrow = weight[:, :, :12]  # d_in = 12: not a multiple of 8
    assert not native_projected_attention_applies(x[..., :12], narrow, mask, 0.0)
    out = projected_self_attention(x[..., :12], narrow, bias, mask, H, 0.0)
    assert type(out.grad_fn).__name__ == "_NativeSelfAttentionBackward"


@pytest.mark.parametrize("queries", [0, 25])
def test_queries_outside_the_sequence_are_refused(queries):
    x, weight, bias, mask = _inputs(B=2)
    with pytest.raises(ValueError, match="queries must be between 1 and the sequence length 24"):
        projected_self_attention(x, weight, bias, mask, H, 0.0, queries)

"""The C self-attention kernel equals softmax attention, forward, backward and twice (docs/performance.md)."""

from __future__ import annotations

import pytest
import torch

from nip_core.scenarios.graph_isomorphism.agents.attention import (
    _composed_self_attention,
    native_self_attention_applies,
    self_attention,
)

H, DH = 4, 4


def _inputs(G=26, mask_batch=13, L=24, dtype=torch.float32, seed=0):
    """Packed projections of ``G`` sequences (not a multiple of the kernel's 16 lanes) and a
    ``(mask_batch, 1, L, L)`` additive mask with blocked keys, as the GI bodies build it."""
    torch.manual_seed(seed)
    qkv = torch.randn(G, L, 3 * H * DH, dtype=torch.float64).to(dtype).requires_grad_()
    blocked = torch.rand(mask_batch, L, L) < 0.4
    blocked[..., :2] = False  # every query sees the two pooled tokens
    mask = torch.zeros(mask_batch, 1, L, L).masked_fill(blocked.unsqueeze(1), float("-inf"))
    return qkv, mask


def _reference(qkv, mask):
    """Float64 softmax attention, sequence ``g`` under mask ``g % mask_batch``."""
    G, L, _ = qkv.shape
    x = qkv.double().view(G, L, 3, H, DH).permute(2, 0, 3, 1, 4)  # (3, G, H, L, dh)
    q, k, v = x[0], x[1], x[2]
    masks = mask.double()[torch.arange(G) % mask.shape[0]]  # (G, 1, L, L)
    weights = torch.softmax(q @ k.transpose(-1, -2) / DH ** 0.5 + masks, -1)
    return (weights @ v).transpose(1, 2).reshape(G, L, H * DH)


def test_the_kernel_is_what_runs_on_the_cpu():
    qkv, mask = _inputs()
    assert native_self_attention_applies(qkv, mask, 0.0)
    assert type(self_attention(qkv, mask, H, 0.0).grad_fn).__name__ == "_NativeSelfAttentionBackward"
    assert not native_self_attention_applies(qkv, mask, 0.1)  # attention dropout: the composition
    assert not native_self_attention_applies(qkv.double(), mask, 0.0)


def test_float32_forward_and_gradients_match_float64_attention():
    qkv, mask = _inputs()
    out = self_attention(qkv, mask, H, 0.0)
    assert out.dtype == torch.float32 and out.shape == (26, 24, H * DH)
    reference_input = qkv.detach().double().requires_grad_()
    expected = _reference(reference_input, mask)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=2e-6)
    grad = torch.randn(out.shape, dtype=torch.float64)
    (got,) = torch.autograd.grad(out, qkv, grad.float())
    (want,) = torch.autograd.grad(expected, reference_input, grad)
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=5e-6)
    # the PyTorch composition the kernel replaces agrees as closely
    composed = _composed_self_attention(qkv, mask, H, 0.0)
    torch.testing.assert_close(out, composed, rtol=1e-5, atol=2e-6)


def test_bfloat16_values_give_bfloat16_results_close_to_float64():
    qkv, mask = _inputs()
    qkv_bf16 = qkv.detach().bfloat16().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = self_attention(qkv_bf16, mask.bfloat16(), H, 0.0)
    assert out.dtype == torch.bfloat16
    expected = _reference(qkv_bf16.detach().double().requires_grad_(), mask)
    # float32 arithmetic on bf16 inputs: only the output's rounding to bf16 (2^-8 relative) remains
    torch.testing.assert_close(out.double(), expected, rtol=8e-3, atol=8e-3)
    grad = torch.randn(out.shape).bfloat16()
    (got,) = torch.autograd.grad(out, qkv_bf16, grad)
    assert got.dtype == torch.bfloat16
    reference_input = qkv_bf16.detach().double().requires_grad_()
    (want,) = torch.autograd.grad(_reference(reference_input, mask), reference_input, grad.double())
    torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=2e-2)


def test_every_sequence_is_computed_alone_whatever_block_it_falls_in():
    """Lanes do not interact: a sequence's result is bit-identical in any batch, so results
    do not depend on the batch size (exact resume, evaluation in other batch sizes)."""
    qkv, mask = _inputs(G=40, mask_batch=40)
    full = self_attention(qkv, mask, H, 0.0).detach()
    part = self_attention(qkv[3:10].detach(), mask[3:10], H, 0.0)
    assert torch.equal(full[3:10], part)
    assert torch.equal(self_attention(qkv, mask, H, 0.0).detach(), full)  # deterministic


def test_blocked_keys_get_no_weight_and_no_gradient():
    qkv, mask = _inputs(G=16, mask_batch=16, L=6)
    mask[:, :, :, 5] = float("-inf")  # nobody sees token 5
    out = self_attention(qkv, mask, H, 0.0)
    (grad,) = torch.autograd.grad(out.sum(), qkv)
    d = H * DH
    assert torch.count_nonzero(grad[:, 5, d:]) == 0  # token 5's key and value have no influence
    changed = qkv.detach().clone()
    changed[:, 5, d:] += 100.0
    assert torch.equal(self_attention(changed, mask, H, 0.0), out.detach())


def test_second_derivatives_go_through_the_composition():
    """SPG differentiates the policy's gradient again: the kernel's backward is differentiable."""
    qkv, mask = _inputs(G=4, mask_batch=2, L=5)
    out = self_attention(qkv, mask, H, 0.0)
    assert type(out.grad_fn).__name__ == "_NativeSelfAttentionBackward"
    (grad,) = torch.autograd.grad((out ** 2).sum(), qkv, create_graph=True)
    (got,) = torch.autograd.grad((grad ** 2).sum(), qkv)
    reference_input = qkv.detach().double().requires_grad_()
    (reference_grad,) = torch.autograd.grad((_reference(reference_input, mask) ** 2).sum(), reference_input,
                                            create_graph=True)
    (want,) = torch.autograd.grad((reference_grad ** 2).sum(), reference_input)
    torch.testing.assert_close(got.double(), want, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("L", [1, 17, 40])
def test_other_sequence_lengths(L):
    qkv, mask = _inputs(G=5, mask_batch=5, L=L)
    if L == 1:
        mask.zero_()
    out = self_attention(qkv, mask, H, 0.0)
    torch.testing.assert_close(out.double(), _reference(qkv.detach(), mask), rtol=1e-5, atol=2e-6)


def test_bfloat16_values_give_the_float32_results_rounded():
    """bf16 in, float32 arithmetic: the same numbers as the float32 kernel on the same values, rounded
    to nearest even as torch rounds (rows converted a chunk at a time; G = 26 leaves a partial block)."""
    qkv, mask = _inputs()
    qkv_bf16 = qkv.detach().bfloat16().requires_grad_()
    wide = qkv_bf16.detach().float().requires_grad_()
    out, out_wide = self_attention(qkv_bf16, mask, H, 0.0), self_attention(wide, mask, H, 0.0)
    assert out.dtype == torch.bfloat16 and torch.equal(out, out_wide.bfloat16())
    grad = torch.randn(out.shape).bfloat16()
    (got,), (want,) = torch.autograd.grad(out, [qkv_bf16], grad), torch.autograd.grad(out_wide, [wide], grad.float())
    assert got.dtype == torch.bfloat16 and torch.equal(got, want.bfloat16())


@pytest.mark.parametrize("queries", [1, 2, 23])
def test_the_first_queries_alone_equal_those_rows_of_the_whole_attention(queries):
    """``queries``: only the first tokens are queries (a value body's two graph tokens). The rows equal
    the whole result's bit for bit (each query row is computed alone, in the same order), and the
    gradients equal those of the whole result with zero gradient at the other rows, in the kernel
    and in the composition (the fallback off the CPU)."""
    qkv, mask = _inputs()
    full = self_attention(qkv, mask, H, 0.0)
    part = self_attention(qkv, mask, H, 0.0, queries)
    assert type(part.grad_fn).__name__ == "_NativeSelfAttentionBackward"
    assert part.shape == (26, queries, H * DH) and torch.equal(part, full[:, :queries])
    grad = torch.randn(part.shape)
    (got,) = torch.autograd.grad(part, qkv, grad)
    (want,) = torch.autograd.grad(full, qkv, torch.cat([grad, torch.zeros(26, 24 - queries, H * DH)], 1))
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    assert torch.count_nonzero(got[:, queries:, :H * DH]) == 0  # the other tokens' queries: no gradient
    composed = _composed_self_attention(qkv, mask, H, 0.0, queries)
    torch.testing.assert_close(composed, part, rtol=1e-5, atol=2e-6)
    (got_composed,) = torch.autograd.grad(composed, qkv, grad)
    torch.testing.assert_close(got_composed, got, rtol=1e-4, atol=5e-6)
    # second derivatives (SPG) through the composition with the same queries
    out = self_attention(qkv, mask, H, 0.0, queries)
    (first,) = torch.autograd.grad((out ** 2).sum(), qkv, create_graph=True)
    (second,) = torch.autograd.grad((first ** 2).sum(), qkv)
    out_composed = _composed_self_attention(qkv, mask, H, 0.0, queries)
    (first_c,) = torch.autograd.grad((out_composed ** 2).sum(), qkv, create_graph=True)
    (second_c,) = torch.autograd.grad((first_c ** 2).sum(), qkv)
    torch.testing.assert_close(second, second_c, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("queries", [0, 25])
def test_queries_outside_the_sequence_are_refused(queries):
    qkv, mask = _inputs()
    with pytest.raises(ValueError, match="queries must be between 1 and the sequence length 24"):
        self_attention(qkv, mask, H, 0.0, queries)

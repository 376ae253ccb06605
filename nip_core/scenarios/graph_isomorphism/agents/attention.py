"""Scaled dot-product attention for the GI bodies' short sequences (docs/performance.md).

The bodies attend over ``2 + 2N`` tokens (24 for 11-node graphs) with heads of size 4, so
every product is a batch of thousands of tiny matrices. On a CPU such a batched product
costs far more per call than its arithmetic, and how much more depends on the shapes: a
``(24×24)·(24×4)`` product (the ``weights @ v`` of attention, and three of the backward
products as autograd writes them) takes about 2.4x the time of the same product written
transposed, ``(4×24)·(24×24)`` (one thread, MKL, 2,048 matrices: 1.76 ms against 0.72 ms).
:func:`attention_core` therefore computes the output and, in float32, every gradient in
the transposed form (:class:`_Attention`), and adds the mask to the scores in place (a
broadcast over the heads) instead of materialising it per head.
"""

from __future__ import annotations

import torch
from torch import Tensor


AUTOCAST_DEVICE_TYPES = ("cpu", "cuda", "xpu", "mps")


def autocast_enabled(reference: Tensor) -> bool:
    """Whether autocast is on for ``reference``'s device type (never for devices it does not know)."""
    device_type = reference.device.type
    return device_type in AUTOCAST_DEVICE_TYPES and torch.is_autocast_enabled(device_type)


class _Attention(torch.autograd.Function):
    """``softmax(q kᵀ + mask) v`` over ``(..., L, dh)`` inputs with hand-laid-out products.

    The scale is already in ``q``. The backward pass is made of differentiable operations
    (products and ``_softmax_backward_data``); when it is itself differentiated (SPG's second
    derivatives, ``create_graph=True``) it recomputes the attention weights from ``q`` and
    ``k`` so that they carry the graph.
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor) -> Tensor:
        *lead, L, dh = q.shape
        scores = torch.bmm(q.reshape(-1, L, dh), k.reshape(-1, L, dh).transpose(1, 2))
        weights = torch.softmax(scores.view(*lead, L, L).add_(attn_mask), dim=-1).view(-1, L, L)
        out_t = torch.bmm(v.reshape(-1, L, dh).transpose(1, 2), weights.transpose(1, 2))  # (w v)ᵀ: (M, dh, L)
        ctx.save_for_backward(q, k, v, weights)
        ctx.attn_mask = attn_mask
        return out_t.view(*lead, dh, L).transpose(-1, -2)

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        q, k, v, weights = ctx.saved_tensors
        *lead, L, dh = q.shape
        q3, k3, v3 = (t.reshape(-1, L, dh) for t in (q, k, v))
        if torch.is_grad_enabled():  # differentiating the backward: weights as a function of q, k
            scores = torch.bmm(q3, k3.transpose(1, 2)).view(*lead, L, L) + ctx.attn_mask
            weights = torch.softmax(scores, dim=-1).view(-1, L, L)
        grad = grad_out.reshape(-1, L, dh)
        grad_weights = torch.bmm(grad, v3.transpose(1, 2))
        grad_v_t = torch.bmm(grad.transpose(1, 2), weights)  # (wᵀ g)ᵀ
        grad_scores = torch._softmax_backward_data(grad_weights, weights, -1, weights.dtype)
        grad_q_t = torch.bmm(k3.transpose(1, 2), grad_scores.transpose(1, 2))  # (ds k)ᵀ
        grad_k_t = torch.bmm(q3.transpose(1, 2), grad_scores)  # (dsᵀ q)ᵀ

        def back(t: Tensor) -> Tensor:
            return t.view(*lead, dh, L).transpose(-1, -2)

        return back(grad_q_t), back(grad_k_t), back(grad_v_t), None


def attention_core(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor, p_dropout: float) -> Tensor:
    """``softmax(q kᵀ / sqrt(dh) + attn_mask) v`` for ``(..., L, dh)`` inputs.

    ``attn_mask`` is additive and broadcasts to ``(..., L, L)`` (e.g. ``(B, 1, L, L)`` for
    inputs ``(B, H, L, dh)``). The result is ``(..., L, dh)``, possibly a transposed view.

    In float32 without dropout this is :class:`_Attention`. Otherwise (bf16 autocast, or
    attention dropout in training) the plain composition runs, with the softmax in float32
    (a bf16 softmax over rows of ~24 is several times slower on CPUs; running the two
    products in float32 as well was measured no faster under bf16 autocast).
    """
    q = q * q.shape[-1] ** -0.5
    plain_float32 = q.dtype == k.dtype == v.dtype == attn_mask.dtype == torch.float32 and not autocast_enabled(q)
    if plain_float32 and p_dropout == 0:
        return _Attention.apply(q, k, v, attn_mask)
    scores = torch.matmul(q, k.transpose(-1, -2)) + attn_mask
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype)
    if p_dropout > 0:
        weights = torch.nn.functional.dropout(weights, p_dropout)
    return torch.matmul(weights, v)

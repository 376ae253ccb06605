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

On the CPU even that is mostly call overhead: :func:`self_attention`, what the bodies call,
runs the C kernel ``nip_core/native/self_attention.c`` (vector lanes across sequences,
forward and backward, 3-4x faster than the products here) and falls back to
:func:`attention_core` where the kernel does not apply or cannot be built.
"""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor

from nip_core.native.build import check_status, load


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

    ``q`` may have fewer rows than ``k`` and ``v`` (queries at the first tokens only; the mask's
    rows are the queries'). In float32 without dropout, every token a query, this is
    :class:`_Attention`. Otherwise (bf16 autocast, or
    attention dropout in training) the plain composition runs, with the softmax in float32
    (a bf16 softmax over rows of ~24 is several times slower on CPUs; running the two
    products in float32 as well was measured no faster under bf16 autocast).
    """
    q = q * q.shape[-1] ** -0.5
    plain_float32 = q.dtype == k.dtype == v.dtype == attn_mask.dtype == torch.float32 and not autocast_enabled(q)
    if plain_float32 and p_dropout == 0 and q.shape[-2] == k.shape[-2]:
        return _Attention.apply(q, k, v, attn_mask)
    scores = torch.matmul(q, k.transpose(-1, -2)) + attn_mask
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype)
    if p_dropout > 0:
        weights = torch.nn.functional.dropout(weights, p_dropout)
    return torch.matmul(weights, v)


def _declare(library: ctypes.CDLL) -> None:
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    library.nip_self_attention_forward.argtypes = [i64, i64, i64, i64, i64, ptr, ctypes.c_int, ptr, i64,
                                                   ctypes.c_float, ptr, ptr]
    library.nip_self_attention_backward.argtypes = [i64, i64, i64, i64, i64, ptr, ctypes.c_int, ptr,
                                                    ctypes.c_float, ptr, ptr]
    library.nip_self_attention_forward.restype = library.nip_self_attention_backward.restype = ctypes.c_int
    library.nip_self_attention_weights_size.argtypes = [i64, i64, i64, i64]
    library.nip_self_attention_weights_size.restype = i64
    library.nip_self_attention_projected_forward.argtypes = [i64, i64, i64, i64, i64, i64, i64, ptr, ptr, ptr, ptr,
                                                             i64, ctypes.c_float, ptr, ptr]
    library.nip_self_attention_projected_backward.argtypes = [i64, i64, i64, i64, i64, i64, i64, ptr, ptr, ptr,
                                                              ptr, ctypes.c_float, ptr, ptr, ptr, ptr]
    library.nip_self_attention_projected_forward.restype = ctypes.c_int
    library.nip_self_attention_projected_backward.restype = ctypes.c_int
    library.nip_self_attention_projected_weights_size.argtypes = [i64, i64, i64, i64, i64]
    library.nip_self_attention_projected_weights_size.restype = i64


def _kernel() -> ctypes.CDLL | None:
    return load("self_attention", _declare)


def _composed_self_attention(qkv: Tensor, attn_mask: Tensor, num_heads: int, p_dropout: float,
                             queries: int | None = None) -> Tensor:
    """:func:`self_attention` as PyTorch operations (:func:`attention_core` over views of ``qkv``)."""
    G, L, width = qkv.shape
    d = width // 3
    mask_batch = attn_mask.shape[0] if attn_mask.dim() == 4 else 1
    q, k, v = qkv.view(G // mask_batch, mask_batch, L, 3, num_heads, d // num_heads).permute(3, 0, 1, 4, 2, 5).unbind(0)
    Lq = L if queries is None else queries
    if Lq < L:
        q, attn_mask = q[..., :Lq, :], attn_mask[..., :Lq, :]
    out = attention_core(q, k, v, attn_mask, p_dropout)  # (G / Bm, Bm, H, Lq, dh)
    return out.transpose(-2, -3).reshape(G, Lq, d)


class _NativeSelfAttention(torch.autograd.Function):
    """:func:`self_attention` by the C kernel (``nip_core/native/self_attention.c``).

    The backward pass is the kernel too; when it is itself differentiated (SPG's second
    derivatives, ``create_graph=True``) it is taken through the PyTorch composition instead.
    """

    @staticmethod
    def forward(ctx, qkv: Tensor, mask: Tensor, num_heads: int, queries: int) -> Tensor:
        G, L, width = qkv.shape
        d = width // 3
        out = qkv.new_empty(G, queries, d)
        kernel = _kernel()
        weights = torch.empty(kernel.nip_self_attention_weights_size(G, L, queries, num_heads), dtype=torch.float32)
        scale = (d // num_heads) ** -0.5
        status = kernel.nip_self_attention_forward(G, L, queries, num_heads, d // num_heads, qkv.data_ptr(),
                                                      int(qkv.dtype == torch.bfloat16), mask.data_ptr(),
                                                      mask.shape[0], scale, out.data_ptr(), weights.data_ptr())
        check_status(status, "self_attention")
        ctx.save_for_backward(qkv, mask, weights)
        ctx.num_heads, ctx.queries, ctx.kernel = num_heads, queries, kernel
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        qkv, mask, weights = ctx.saved_tensors
        if torch.is_grad_enabled():  # differentiating the backward: through the composition
            out = _composed_self_attention(qkv, mask.unsqueeze(1), ctx.num_heads, 0.0, ctx.queries)
            return torch.autograd.grad(out, qkv, grad_out, create_graph=True)[0], None, None, None
        G, L, width = qkv.shape
        H = ctx.num_heads
        dh = width // 3 // H
        grad_out = grad_out.to(qkv.dtype).contiguous()
        grad_qkv = torch.empty_like(qkv)
        status = ctx.kernel.nip_self_attention_backward(G, L, ctx.queries, H, dh, qkv.data_ptr(),
                                                        int(qkv.dtype == torch.bfloat16), weights.data_ptr(),
                                                        dh ** -0.5, grad_out.data_ptr(), grad_qkv.data_ptr())
        check_status(status, "self_attention")
        return grad_qkv, None, None, None


def native_self_attention_applies(qkv: Tensor, attn_mask: Tensor, p_dropout: float) -> bool:
    """Whether :func:`self_attention` runs the C kernel for these inputs (else the composition)."""
    G, L = qkv.shape[:2]
    return (qkv.device.type == "cpu" and p_dropout == 0 and qkv.dtype in (torch.float32, torch.bfloat16)
            and attn_mask.dim() == 4 and attn_mask.shape[1:] == (1, L, L) and G % attn_mask.shape[0] == 0
            and attn_mask.device.type == "cpu" and _kernel() is not None)


@torch.compiler.disable
def self_attention(qkv: Tensor, attn_mask: Tensor, num_heads: int, p_dropout: float,
                   queries: int | None = None) -> Tensor:
    """Multi-head self-attention from the packed in-projection, before the out-projection.

    ``qkv`` is ``(G, L, 3 d)``: each token's ``[q | k | v]``, each ``num_heads`` heads of
    ``d / num_heads``. ``attn_mask`` is additive, ``(Bm, 1, L, L)`` with ``G`` a multiple of
    ``Bm``: sequence ``g`` uses mask ``g % Bm`` (several bodies' sequences stacked as
    ``g = k Bm + b``). Returns ``(G, L, d)``, the heads side by side as
    :class:`torch.nn.MultiheadAttention` concatenates them. With ``queries``, only the first
    ``queries`` tokens are queries (every token still a key and a value): ``(G, queries, d)``,
    equal to the first ``queries`` rows of the whole result.

    On the CPU without dropout this is the C kernel ``nip_core/native/self_attention.c``
    (float32 or bfloat16 values, float32 arithmetic; docs/performance.md); otherwise, or when
    the kernel cannot be built, :func:`attention_core` over views of ``qkv``.
    """
    L = qkv.shape[1]
    if queries is not None and not 1 <= queries <= L:
        raise ValueError(f"self_attention: queries must be between 1 and the sequence length {L}, got {queries}")
    if native_self_attention_applies(qkv, attn_mask, p_dropout):
        mask = attn_mask.reshape(attn_mask.shape[0], *attn_mask.shape[2:]).to(torch.float32).contiguous()
        return _NativeSelfAttention.apply(qkv.contiguous(), mask, num_heads, L if queries is None else queries)
    return _composed_self_attention(qkv, attn_mask, num_heads, p_dropout, queries)


def _projected(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """Body ``k``'s in-projection of its sequences: ``(G, L, 3 d)`` from ``x (G, L, d_in)`` (``G = K B``)."""
    G, L, d_in = x.shape
    K = weight.shape[0]
    qkv = torch.baddbmm(bias.unsqueeze(1), x.reshape(K, -1, d_in), weight.transpose(1, 2))
    return qkv.view(G, L, weight.shape[1])


class _NativeProjectedSelfAttention(torch.autograd.Function):
    """:func:`projected_self_attention` by the C kernel; differentiated twice through the composition."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor, mask: Tensor, num_heads: int, queries: int) -> Tensor:
        G, L, d_in = x.shape
        K, width = weight.shape[:2]
        d = width // 3
        kernel = _kernel()
        out = x.new_empty(G, queries, d)
        weights = torch.empty(kernel.nip_self_attention_projected_weights_size(K, G // K, L, queries, num_heads),
                              dtype=torch.float32)
        status = kernel.nip_self_attention_projected_forward(
            K, G // K, L, queries, num_heads, d // num_heads, d_in, x.data_ptr(), weight.data_ptr(), bias.data_ptr(),
            mask.data_ptr(), mask.shape[0], (d // num_heads) ** -0.5, out.data_ptr(), weights.data_ptr())
        check_status(status, "self_attention")
        ctx.save_for_backward(x, weight, bias, mask, weights)
        ctx.num_heads, ctx.queries, ctx.kernel = num_heads, queries, kernel
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        x, weight, bias, mask, weights = ctx.saved_tensors
        if torch.is_grad_enabled():  # differentiating the backward: through the composition
            out = _composed_self_attention(_projected(x, weight, bias), mask.unsqueeze(1), ctx.num_heads, 0.0,
                                           ctx.queries)
            inputs = (x, weight, bias)
            wanted = [t for t in inputs if t.requires_grad]
            grads = iter(torch.autograd.grad(out, wanted, grad_out, create_graph=True))
            return (*(next(grads) if t.requires_grad else None for t in inputs), None, None, None)
        G, L, d_in = x.shape
        K, width = weight.shape[:2]
        dh = width // 3 // ctx.num_heads
        grad_out = grad_out.to(torch.float32).contiguous()
        grad_x, grad_weight, grad_bias = torch.empty_like(x), torch.empty_like(weight), torch.empty_like(bias)
        status = ctx.kernel.nip_self_attention_projected_backward(
            K, G // K, L, ctx.queries, ctx.num_heads, dh, d_in, x.data_ptr(), weight.data_ptr(), bias.data_ptr(),
            weights.data_ptr(), dh ** -0.5, grad_out.data_ptr(), grad_x.data_ptr(), grad_weight.data_ptr(),
            grad_bias.data_ptr())
        check_status(status, "self_attention")
        return grad_x, grad_weight, grad_bias, None, None, None


def native_projected_attention_applies(x: Tensor, weight: Tensor, attn_mask: Tensor, p_dropout: float) -> bool:
    """Whether :func:`projected_self_attention` runs the C kernel (float32 on the CPU, no autocast, no
    dropout, projection widths in multiples of 8); else the in-projection as a batched product, then
    :func:`self_attention`."""
    return (x.dtype == weight.dtype == torch.float32 and not autocast_enabled(x) and weight.device.type == "cpu"
            and weight.shape[1] % 8 == 0 and weight.shape[2] % 8 == 0 and x.shape[0] % weight.shape[0] == 0
            and native_self_attention_applies(x, attn_mask, p_dropout))


@torch.compiler.disable
def projected_self_attention(x: Tensor, weight: Tensor, bias: Tensor, attn_mask: Tensor, num_heads: int,
                             p_dropout: float, queries: int | None = None) -> Tensor:
    """:func:`self_attention` of the in-projection ``x W_kᵀ + b_k`` of every body ``k``.

    ``x`` is ``(G, L, d_in)``, ``G = K B``: the sequences of ``K`` bodies, body ``k``'s being
    ``k B .. (k + 1) B``; ``weight`` ``(K, 3 d, d_in)`` and ``bias`` ``(K, 3 d)`` are the bodies'
    :class:`torch.nn.MultiheadAttention` ``in_proj_weight`` and ``in_proj_bias`` stacked. The mask and
    ``queries`` are :func:`self_attention`'s. On the CPU in float32 (no autocast, no dropout) this is one
    C kernel that computes the projection a block of sequences at a time and never writes it out (the
    backward pass computes it again); otherwise the projection as a batched product, then
    :func:`self_attention`.
    """
    G, L, _ = x.shape
    if queries is not None and not 1 <= queries <= L:
        raise ValueError(f"self_attention: queries must be between 1 and the sequence length {L}, got {queries}")
    if native_projected_attention_applies(x, weight, attn_mask, p_dropout):
        mask = attn_mask.reshape(attn_mask.shape[0], *attn_mask.shape[2:]).to(torch.float32).contiguous()
        return _NativeProjectedSelfAttention.apply(x.contiguous(), weight.contiguous(), bias.contiguous(), mask,
                                                   num_heads, L if queries is None else queries)
    return self_attention(_projected(x, weight, bias), attn_mask, num_heads, p_dropout, queries)

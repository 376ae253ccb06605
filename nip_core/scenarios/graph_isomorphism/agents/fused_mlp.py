"""K stacked two-layer MLPs in one C kernel on the CPU (docs/performance.md, "The MLP kernel").

The stacked GI bodies' GIN layers (tanh) and transformer feed-forward blocks (relu) are
``act(x W1 + b1) W2 + b2`` over ~11,000 rows of 16 numbers with a 64-wide hidden layer.
:func:`stacked_two_layer_mlp` runs them through ``nip_core/native/two_layer_mlp.c``, which writes
the hidden tensor at most once (the activations, kept for the backward pass when one follows),
reads the weights where they lie (``nn.Linear``'s, transposed), and falls back to batched
products where the kernel does not apply.
"""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor

from nip_core.native.build import check_status, load
from nip_core.scenarios.graph_isomorphism.agents.attention import autocast_enabled

ACTIVATIONS = {"relu": 0, "sigmoid": 1, "tanh": 2}
CHUNK = 8  # two_layer_mlp.c's register blocking


def _declare(library: ctypes.CDLL) -> None:
    i64, ptr, i32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    library.nip_mlp2_forward.argtypes = [i64, i64, i64, i64, i64, ptr, i32, ptr, ptr, i32, ptr, ptr, ptr, ptr, i64,
                                         ptr, ptr]
    library.nip_mlp2_backward.argtypes = [i64, i64, i64, i64, i64, ptr, i32, ptr, ptr, i32, ptr, ptr, ptr,
                                          ptr, ptr, ptr, ptr, ptr, i64, ptr, ptr]
    library.nip_mlp2_forward.restype = library.nip_mlp2_backward.restype = ctypes.c_int
    library.nip_mlp2_hidden_size.argtypes = [i64, i64, i64]
    library.nip_mlp2_hidden_size.restype = i64


def _kernel() -> ctypes.CDLL | None:
    return load("two_layer_mlp", _declare)


def _composed(x: Tensor, w1: Tensor, b1: Tensor, activation: str, w2: Tensor, b2: Tensor,
              rows: Tensor | None = None) -> Tensor:
    if activation == "tanh":  # tanh(z) = 2 sigmoid(2z) - 1: the factors and the shift moved into the weights
        return _composed(x, 2 * w1, 2 * b1, "sigmoid", 2 * w2, b2 - w2.sum(1), rows)
    if rows is not None:  # every row computed, then the others set to 0 (cheaper than gathering the rows)
        left_out = torch.ones(x.shape[1], dtype=torch.bool, device=x.device).index_fill_(0, rows, False)
        return _composed(x, w1, b1, activation, w2, b2).index_fill(1, left_out.nonzero().squeeze(1), 0)
    hidden = torch.baddbmm(b1.unsqueeze(1), x, w1)
    hidden = torch.sigmoid(hidden) if activation == "sigmoid" else torch.relu(hidden)
    return torch.baddbmm(b2.unsqueeze(1), hidden, w2)


def _row_list(rows: Tensor | None) -> tuple[int | None, int]:
    """The kernel's ``rows, n_rows`` arguments (``NULL`` for all rows)."""
    return (None, 0) if rows is None else (rows.data_ptr(), rows.numel())


def _strides(w1: Tensor, w2: Tensor) -> ctypes.Array:
    """The kernel's ``strides`` argument: the weights are read where they lie (no contiguous copies)."""
    return (ctypes.c_int64 * 6)(*w1.stride(), *w2.stride())


class _NativeStackedMlp(torch.autograd.Function):
    """:func:`stacked_two_layer_mlp` by the C kernel; differentiated twice through the composition.

    With ``keep_hidden`` (a backward pass will follow) the forward pass keeps the activations
    (``(K, rows, dh)`` float32 in the kernel's layout, ~4.7 MB for a GIN layer of the paper's
    workload) and the backward pass reads them instead of computing the first layer and the
    activation again: on the paper's GIN layers the backward pass does 40 % fewer operations.
    """

    @staticmethod
    def forward(ctx, x: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor, activation: str,
                rows: Tensor | None, keep_hidden: bool) -> Tensor:
        K, M, din = x.shape
        dh, dout = w1.shape[-1], w2.shape[-1]
        y = x.new_empty(K, M, dout)  # the rows not computed are set to 0 by the kernel
        kernel = _kernel()
        hidden = None
        if keep_hidden:
            computed = M if rows is None else rows.numel()
            hidden = torch.empty(kernel.nip_mlp2_hidden_size(K, computed, dh), dtype=torch.float32)
        status = kernel.nip_mlp2_forward(K, M, din, dh, dout, x.data_ptr(), int(x.dtype == torch.bfloat16),
                                         w1.data_ptr(), b1.data_ptr(), ACTIVATIONS[activation], w2.data_ptr(),
                                         b2.data_ptr(), y.data_ptr(), *_row_list(rows), _strides(w1, w2),
                                         None if hidden is None else hidden.data_ptr())
        check_status(status, "two_layer_mlp")
        ctx.save_for_backward(x, w1, b1, w2, b2, rows, hidden)
        ctx.activation, ctx.kernel = activation, kernel
        return y

    @staticmethod
    def backward(ctx, grad_y: Tensor):
        x, w1, b1, w2, b2, rows, hidden = ctx.saved_tensors
        if torch.is_grad_enabled():  # differentiating the backward: through the composition
            inputs = (x, w1, b1, w2, b2)
            wanted = [t for t in inputs if t.requires_grad]
            grads = iter(torch.autograd.grad(_composed(x, w1, b1, ctx.activation, w2, b2, rows), wanted, grad_y,
                                             create_graph=True))
            return (*(next(grads) if t.requires_grad else None for t in inputs), None, None, None)
        K, M, din = x.shape
        dh, dout = w1.shape[-1], w2.shape[-1]
        grad_y = grad_y.to(x.dtype).contiguous()
        grad_x = torch.empty_like(x)  # the rows not computed: 0, set by the kernel
        grad_w1, grad_b1, grad_w2, grad_b2 = (torch.empty(t.shape) for t in (w1, b1, w2, b2))  # contiguous
        status = ctx.kernel.nip_mlp2_backward(K, M, din, dh, dout, x.data_ptr(), int(x.dtype == torch.bfloat16),
                                              w1.data_ptr(), b1.data_ptr(), ACTIVATIONS[ctx.activation],
                                              w2.data_ptr(), grad_y.data_ptr(), grad_x.data_ptr(),
                                              grad_w1.data_ptr(), grad_b1.data_ptr(), grad_w2.data_ptr(),
                                              grad_b2.data_ptr(), *_row_list(rows), _strides(w1, w2),
                                              None if hidden is None else hidden.data_ptr())
        check_status(status, "two_layer_mlp")
        return grad_x, grad_w1, grad_b1, grad_w2, grad_b2, None, None, None


def native_mlp_applies(x: Tensor, activation: str, sizes: tuple[int, ...]) -> bool:
    """Whether :func:`stacked_two_layer_mlp` runs the C kernel (else batched products); ``sizes`` are
    ``(din, dh, dout)``, which the kernel needs in multiples of ``CHUNK``."""
    return (x.device.type == "cpu" and x.dtype in (torch.float32, torch.bfloat16) and activation in ACTIVATIONS
            and all(size % CHUNK == 0 for size in sizes) and _kernel() is not None)


@torch.compiler.disable
def stacked_two_layer_mlp(x: Tensor, w1: Tensor, b1: Tensor, activation: str, w2: Tensor, b2: Tensor,
                          rows: Tensor | None = None) -> Tensor:
    """``act(x[k] w1[k] + b1[k]) w2[k] + b2[k]`` for every ``k``: ``(K, M, dout)``.

    ``x`` is ``(K, M, din)``, ``w1`` ``(K, din, dh)``, ``b1`` ``(K, dh)``, ``w2`` ``(K, dh, dout)``,
    ``b2`` ``(K, dout)``; ``activation`` is ``"relu"``, ``"sigmoid"`` or ``"tanh"``. ``rows`` (ascending int64
    indices into ``M``, the same for every ``k``), when given, are the rows computed: every other
    row of the result is 0 (and passes no gradient back). A GI body's GNN leaves the padding
    nodes out this way. Float32 rows take the kernel, and so do bf16 ones: float32 arithmetic,
    the hidden layer kept in float32, the result in the rows' dtype. Under CPU bf16 autocast the
    rows and the weights are first rounded to bf16, as autocast casts a product's operands, and
    the kernel runs on them, on CPUs with native bf16 too: there it measured 1.06x (an Intel Xeon
    with AMX) and 1.26x (an Intel Xeon with AVX512-BF16 alone) faster per step than oneDNN's bf16
    batched products (docs/performance.md; on an AMD EPYC Zen 4 the products were faster than the
    slower kernel of 2026-12-03, and have not been measured against today's). Elsewhere (CUDA,
    other dtypes, sizes the kernel does not take) the batched products, in the autocast dtype
    under autocast.
    """
    if autocast_enabled(x):
        dtype = torch.get_autocast_dtype(x.device.type)
        if x.device.type != "cpu" or dtype != torch.bfloat16:
            return _composed(x.to(dtype), w1, b1, activation, w2, b2, rows)
        x = x.to(dtype)
        w1, b1, w2, b2 = (t.to(dtype) for t in (w1, b1, w2, b2))
    if native_mlp_applies(x, activation, (x.shape[-1], w1.shape[-1], w2.shape[-1])):
        w1, w2 = w1.to(torch.float32), w2.to(torch.float32)  # of any strides
        b1, b2 = b1.to(torch.float32).contiguous(), b2.to(torch.float32).contiguous()
        keep_hidden = torch.is_grad_enabled() and any(t.requires_grad for t in (x, w1, b1, w2, b2))
        return _NativeStackedMlp.apply(x.contiguous(), w1, b1, w2, b2, activation, rows, keep_hidden)
    return _composed(x, w1, b1, activation, w2, b2, rows)


def folded_tanh_mlp(x: Tensor, w1: Tensor, b1: Tensor | None, w2: Tensor, b2: Tensor | None,
                    rows: Tensor | None = None) -> Tensor:
    """``tanh(x w1 + b1) w2 + b2`` per body (:func:`~nip_core.agents.mlp.two_layer_mlp`'s FastTanh MLP):
    the kernel's tanh, or the batched products with tanh folded into a sigmoid as ``two_layer_mlp``
    folds it (``tanh(z) = 2 sigmoid(2z) - 1``, the factors and the shift moved into the weights,
    made per call so that autograd carries their gradients to the parameters). Shapes and ``rows``
    as :func:`stacked_two_layer_mlp`; ``None`` biases are zero."""
    b1 = torch.zeros_like(w1[:, 0]) if b1 is None else b1
    b2 = torch.zeros_like(w2[:, 0]) if b2 is None else b2
    return stacked_two_layer_mlp(x, w1, b1, "tanh", w2, b2, rows)

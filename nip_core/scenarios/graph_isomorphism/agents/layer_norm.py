"""K stacked layer norms in one C kernel on the CPU (docs/performance.md, "The layer-norm kernel").

The GI bodies' transformer normalises ~12,000 rows of 16 numbers at a time, each body with its
own affine. :func:`stacked_layer_norm` runs that through ``nip_core/native/layer_norm.c`` (one
pass each way, the affine and its gradients included) and falls back to ``F.layer_norm`` and a
per-body ``addcmul`` where the kernel does not apply.
"""

from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F
from torch import Tensor

from nip_core.native.build import check_status, load


def _declare(library: ctypes.CDLL) -> None:
    i64, ptr, i32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    library.nip_layer_norm_forward.argtypes = [i64, i64, i64, ptr, i32, ptr, ptr, ctypes.c_float, ptr, i32, ptr, ptr]
    library.nip_layer_norm_backward.argtypes = [i64, i64, i64, ptr, i32, ptr, ptr, ptr, ptr, i32, ptr, ptr, ptr]
    library.nip_layer_norm_forward.restype = library.nip_layer_norm_backward.restype = ctypes.c_int


def _kernel() -> ctypes.CDLL | None:
    return load("layer_norm", _declare)


def _composed(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float) -> Tensor:
    out = F.layer_norm(x, x.shape[-1:], None, None, eps)
    if weight is None:
        return out
    return torch.addcmul(bias.unsqueeze(1), out, weight.unsqueeze(1))


def _pointer(t: Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


class _NativeLayerNorm(torch.autograd.Function):
    """:func:`stacked_layer_norm` by the C kernel; differentiated twice through the composition."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float,
                out_dtype: torch.dtype) -> Tensor:
        K, M, d = x.shape
        kernel = _kernel()
        y = torch.empty(K, M, d, dtype=out_dtype)
        mean, rstd = (torch.empty(K * M, dtype=torch.float32) for _ in range(2))
        status = kernel.nip_layer_norm_forward(K, M, d, x.data_ptr(), int(x.dtype == torch.bfloat16),
                                               _pointer(weight), _pointer(bias), eps, y.data_ptr(),
                                               int(out_dtype == torch.bfloat16), mean.data_ptr(), rstd.data_ptr())
        check_status(status, "layer_norm")
        ctx.save_for_backward(x, weight, bias, mean, rstd)
        ctx.eps, ctx.out_dtype, ctx.kernel = eps, out_dtype, kernel
        return y

    @staticmethod
    def backward(ctx, grad_y: Tensor):
        x, weight, bias, mean, rstd = ctx.saved_tensors
        affine = [t for t in (weight, bias) if t is not None]
        if torch.is_grad_enabled():  # differentiating the backward: through the composition
            inputs = [x, *affine]
            wanted = [t for t in inputs if t.requires_grad]
            grads = iter(torch.autograd.grad(_composed(x, weight, bias, ctx.eps), wanted, grad_y, create_graph=True))
            got = [next(grads) if t.requires_grad else None for t in inputs]
            return got[0], *(got[1:] if affine else (None, None)), None, None
        K, M, d = x.shape
        grad_y = grad_y.to(ctx.out_dtype).contiguous()
        grad_x = torch.empty_like(x)
        grad_w, grad_b = (torch.empty_like(t) for t in (weight, bias)) if affine else (None, None)
        status = ctx.kernel.nip_layer_norm_backward(K, M, d, x.data_ptr(), int(x.dtype == torch.bfloat16),
                                                    _pointer(weight), mean.data_ptr(), rstd.data_ptr(),
                                                    grad_y.data_ptr(), int(ctx.out_dtype == torch.bfloat16),
                                                    grad_x.data_ptr(), _pointer(grad_w), _pointer(grad_b))
        check_status(status, "layer_norm")
        return grad_x, grad_w, grad_b, None, None


def native_layer_norm_applies(x: Tensor, weight: Tensor | None) -> bool:
    """Whether :func:`stacked_layer_norm` runs the C kernel (else the PyTorch operations)."""
    dtypes = (torch.float32, torch.bfloat16)
    return (x.device.type == "cpu" and x.dtype in dtypes and (weight is None or weight.dtype == torch.float32)
            and _kernel() is not None)


@torch.compiler.disable
def stacked_layer_norm(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float) -> Tensor:
    """Body ``k``'s layer norm of every row of ``x[k]``: ``(x - mean) / sqrt(var + eps) w[k] + b[k]``.

    ``x`` is ``(K, M, d)``, ``weight`` and ``bias`` ``(K, d)`` (no weight: no affine; no bias: 0). The
    result has the dtype ``F.layer_norm`` and a float32 ``addcmul`` give it (float32 for bf16
    rows with float32 weights, as under autocast). On the CPU with float32 or bfloat16 rows this
    is the C kernel (float32 arithmetic); otherwise the PyTorch operations.
    """
    if weight is None and bias is not None:
        raise ValueError("stacked_layer_norm: a bias needs a weight")
    if weight is not None and bias is None:  # nn.LayerNorm(bias=False)
        bias = torch.zeros_like(weight)
    if native_layer_norm_applies(x, weight):
        out_dtype = x.dtype if weight is None else torch.promote_types(x.dtype, weight.dtype)
        affine = (weight.contiguous(), bias.to(torch.float32).contiguous()) if weight is not None else (None, None)
        return _NativeLayerNorm.apply(x.contiguous(), *affine, eps, out_dtype)
    return _composed(x, weight, bias, eps)


def layer_norm(norm: torch.nn.LayerNorm, x: Tensor) -> Tensor:
    """``norm(x)`` over the last dimension as the stacked bodies compute it (:func:`stacked_layer_norm`, K = 1)."""
    weight, bias = (None if t is None else t.unsqueeze(0) for t in (norm.weight, norm.bias))
    return stacked_layer_norm(x.reshape(1, -1, x.shape[-1]), weight, bias, norm.eps).view(x.shape)

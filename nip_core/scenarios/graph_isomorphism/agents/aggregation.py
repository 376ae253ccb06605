"""The GIN layers' aggregation ``(A + I) act(m ⊙ z)`` in one C kernel on the CPU (docs/performance.md).

Before each GIN layer's MLP, a GI body's GNN applies the activation to the previous layer's
masked output and sums every node's neighbours and itself: a broadcast multiply, an activation
and a batched product of ~1,000 ``(11 × 11)·(11 × 16)`` matrices, each costing far more per
call than its arithmetic, forwards and backwards. :func:`gin_aggregate` runs it through
``nip_core/native/gin_aggregate.c`` (one pass over the rows each way; the backward pass
recomputes the activation) and falls back to those operations where the kernel does not apply.
"""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor, nn

from nip_core.agents.mlp import FastTanh
from nip_core.native.build import check_status, load
from nip_core.scenarios.graph_isomorphism.agents.attention import autocast_enabled

ACTIVATIONS = {nn.ReLU: 0, FastTanh: 1}


def _declare(library: ctypes.CDLL) -> None:
    i64, ptr, i32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    library.nip_gin_aggregate_forward.argtypes = [i64, i64, i64, ptr, ptr, ptr, i64, i32, i32, ptr]
    library.nip_gin_aggregate_backward.argtypes = [i64, i64, i64, ptr, ptr, ptr, i64, i32, i32, ptr, ptr]
    library.nip_gin_aggregate_forward.restype = library.nip_gin_aggregate_backward.restype = ctypes.c_int


def _kernel() -> ctypes.CDLL | None:
    return load("gin_aggregate", _declare)


def _composed(z: Tensor, self_adjacency: Tensor, node_mask: Tensor, activation: nn.Module) -> Tensor:
    repeats = z.shape[0] // self_adjacency.shape[0]
    z = z.view(repeats, -1, *z.shape[1:])
    # the mask at full size: on CPUs a broadcasting bf16 multiply is ~10x slower than an elementwise one
    mask = node_mask.unsqueeze(-1).expand(z.shape)
    if z.device.type == "cpu":
        mask = mask.contiguous()
    x = activation(z * mask)
    return torch.matmul(self_adjacency, x).view(-1, *x.shape[2:])


class _NativeGinAggregate(torch.autograd.Function):
    """:func:`gin_aggregate` by the C kernel; differentiated twice through the composition."""

    @staticmethod
    def forward(ctx, z: Tensor, self_adjacency: Tensor, node_mask: Tensor, activation: nn.Module) -> Tensor:
        G, N, d = z.shape
        kernel = _kernel()
        y = torch.empty_like(z)
        status = kernel.nip_gin_aggregate_forward(G, N, d, z.data_ptr(), self_adjacency.data_ptr(),
                                                  node_mask.data_ptr(), node_mask.shape[0],
                                                  int(z.dtype == torch.bfloat16),
                                                  ACTIVATIONS[type(activation)], y.data_ptr())
        check_status(status, "gin_aggregate")
        ctx.save_for_backward(z, self_adjacency, node_mask)
        ctx.activation, ctx.kernel = activation, kernel
        return y

    @staticmethod
    def backward(ctx, grad_y: Tensor):
        z, self_adjacency, node_mask = ctx.saved_tensors
        if torch.is_grad_enabled():  # differentiating the backward: through the composition
            y = _composed(z, self_adjacency, node_mask, ctx.activation)
            return torch.autograd.grad(y, z, grad_y, create_graph=True)[0], None, None, None
        G, N, d = z.shape
        grad_y = grad_y.to(z.dtype).contiguous()
        grad_z = torch.empty_like(z)
        status = ctx.kernel.nip_gin_aggregate_backward(G, N, d, z.data_ptr(), self_adjacency.data_ptr(),
                                                       node_mask.data_ptr(), node_mask.shape[0],
                                                       int(z.dtype == torch.bfloat16),
                                                       ACTIVATIONS[type(ctx.activation)], grad_y.data_ptr(),
                                                       grad_z.data_ptr())
        check_status(status, "gin_aggregate")
        return grad_z, None, None, None


def native_aggregation_applies(z: Tensor, activation: nn.Module) -> bool:
    """Whether :func:`gin_aggregate` runs the C kernel (else the PyTorch operations)."""
    return (z.device.type == "cpu" and z.dtype in (torch.float32, torch.bfloat16)
            and type(activation) in ACTIVATIONS and _kernel() is not None)


@torch.compiler.disable
def gin_aggregate(z: Tensor, self_adjacency: Tensor, node_mask: Tensor, activation: nn.Module) -> Tensor:
    """``self_adjacency @ activation(z * node_mask)`` for every graph: ``(G, N, d)``.

    ``z`` is ``(G, N, d)`` (the previous layer's output before masking), ``self_adjacency``
    ``(Gd, N, N)`` (``A + I``) and ``node_mask`` ``(Gd, N)`` (1 for real nodes, 0 for padding)
    with ``G`` a multiple of ``Gd``: graph ``g`` has adjacency and mask ``g % Gd`` (several
    bodies' copies of the same graphs stacked as ``g = k Gd + b``); neither gets a gradient.
    On the CPU with tanh (:class:`FastTanh`) or relu, float32 or bfloat16 values, this is the C
    kernel (float32 arithmetic, the result in ``z``'s dtype, as the batched product under
    autocast gives it); otherwise the PyTorch operations.
    """
    G, N, _ = z.shape
    Gd = node_mask.shape[0]
    if self_adjacency.shape != (Gd, N, N) or node_mask.shape != (Gd, N) or G % Gd != 0:
        raise ValueError(f"gin_aggregate: z {tuple(z.shape)} needs an adjacency (Gd, {N}, {N}) and a mask (Gd, {N}) "
                         f"with {G} a multiple of Gd; got {tuple(self_adjacency.shape)} and {tuple(node_mask.shape)}")
    if autocast_enabled(z):  # as the batched product would run
        z = z.to(torch.get_autocast_dtype(z.device.type))
    if native_aggregation_applies(z, activation):
        data = [t.to(z.dtype).contiguous() for t in (self_adjacency, node_mask)]
        return _NativeGinAggregate.apply(z.contiguous(), *data, activation)
    return _composed(z, self_adjacency, node_mask, activation)

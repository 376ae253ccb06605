"""Arithmetic precision of the TensorDict trainers' agents (``rl.precision``).

``fp32``: everything in float32. ``bf16``: mixed precision, as the usual recipe: the
agents' forward passes (collection, value estimates, the loss's forward) run under
``torch.autocast(device_type, dtype=torch.bfloat16)`` on the CPU as on CUDA, so that the
matrix products run on bfloat16 operands; the weights, gradients and optimiser state stay
float32 (autocast casts the weights on the fly and the backward pass accumulates the weight
gradients in float32), and the agents return their logits and values in float32, so the
log-probabilities, ratios, advantages and losses are computed in float32.

On a CPU without native bf16 (no AVX512-BF16, no AMX) PyTorch's own bf16 products run ~100x
slower than float32 ones (0.9 against 84 GFLOP/s on an AMD EPYC Zen 3, where a GI iteration
took 8.5x as long in bf16). There the products autocast would run in bf16 are computed in
float32 on the bf16-rounded operands and rounded to bf16 (:class:`Float32Bf16Products`): a
product of two bf16 numbers is exact in float32 and bf16 products accumulate in float32, so
this is the same arithmetic up to the order of the sums, with float32's products (a GI
iteration measured 1.2-1.4x slower than in float32, from the casts and the mode's Python on
every torch call, against 8.5x before). The GI agents' C kernels compute in float32 on bf16 rows either way.

``auto`` picks one of the two per machine (:func:`resolve_precision`), by what a whole GI
iteration measured on the paper workload (docs/performance.md), not by the GEMM peaks: today
that is float32 everywhere. On a CPU with native bf16 the step is bound by memory and by many
small ops, and the C kernels compute in float32 either way: a bf16 iteration measured at
parity on AMD EPYCs with AVX512-BF16 and 4 % slower on an Intel Xeon with AMX (5.63 against
5.42 s per iteration), for less precision. On a CUDA GPU the eager step is bound by the host,
so bf16's casts made it slower (1.95 against 3.05 s per iteration on an H200). The trainer
records what it picked, and why, in the run's ``metadata.json`` (``precision``), and the
result card shows it.
"""

from __future__ import annotations

import contextlib
import logging
from typing import ContextManager

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

from nip_core.utils.cpu import cpu_has_native_bf16

PRECISION_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
AUTO = "auto"
NO_NATIVE_BF16 = ("this CPU has no native bf16 (no AVX512-BF16, no AMX): bf16 products are computed in "
                  "float32 on bf16-rounded operands here, and a bf16 GI iteration measured 1.2-1.4x slower than "
                  "float32 (docs/performance.md)")
NATIVE_BF16_NO_FASTER = ("this CPU computes bf16 natively (AVX512-BF16 or AMX), but a bf16 GI iteration "
                         "measured no faster than float32 on such CPUs (docs/performance.md)")

logger = logging.getLogger(__name__)


def autocast_dtype(precision: str) -> torch.dtype | None:
    """The autocast dtype of ``precision``; ``None`` for full float32.

    Raises
    ------
    ValueError
        If ``precision`` is not one of ``fp32``, ``bf16`` (naming ``rl.precision``).
    """
    try:
        dtype = PRECISION_DTYPES[precision]
    except KeyError:
        raise ValueError(f"rl.precision: unknown precision {precision!r} "
                         f"(known: {sorted(PRECISION_DTYPES) + [AUTO]})") from None
    return None if dtype == torch.float32 else dtype


def resolve_precision(precision: str, device: str | torch.device) -> tuple[str, str]:
    """``(fp32 or bf16, why)``: ``precision`` itself, or what ``auto`` picks on ``device``.

    Raises
    ------
    ValueError
        If ``precision`` is not ``fp32``, ``bf16`` or ``auto`` (naming ``rl.precision``).
    """
    if precision != AUTO:
        autocast_dtype(precision)  # refuses an unknown one
        if precision == "bf16" and torch.device(device).type == "cpu" and not cpu_has_native_bf16():
            logger.warning("rl.precision=bf16: %s; rl.precision=auto would pick fp32", NO_NATIVE_BF16)
            return precision, f"rl.precision; {NO_NATIVE_BF16}"
        return precision, "rl.precision"
    device_type = torch.device(device).type
    if device_type != "cpu":
        return "fp32", f"auto: float32 on {device_type} (the eager step is bound by the host; bf16 measured slower)"
    if cpu_has_native_bf16():
        return "fp32", f"auto: {NATIVE_BF16_NO_FASTER}"
    return "fp32", f"auto: {NO_NATIVE_BF16}"


#: The products CPU autocast runs in bf16 that the agents call, as torch functions and Tensor methods.
_PRODUCTS = frozenset({
    torch.mm, torch.bmm, torch.matmul, torch.baddbmm, torch.addmm, torch.addbmm, torch.nn.functional.linear,
    Tensor.mm, Tensor.bmm, Tensor.matmul, Tensor.__matmul__, Tensor.__rmatmul__, Tensor.baddbmm, Tensor.addmm,
    Tensor.addbmm,
})


def _bf16_valued(value: object) -> object:
    """A float32 or bf16 tensor as float32 holding its bf16 rounding; anything else as it is."""
    if isinstance(value, Tensor) and value.dtype in (torch.float32, torch.bfloat16):
        return value.to(torch.bfloat16).to(torch.float32)
    return value


class Float32Bf16Products(TorchFunctionMode):
    """Under CPU bf16 autocast, the matrix products of ``_PRODUCTS`` in float32 on bf16 values.

    Each operand autocast would cast (float32 or bf16, on the CPU) is rounded to bf16, the
    product runs in float32 with autocast off, and the result is rounded to bf16, as autocast
    returns it. Products of bf16 numbers are exact in float32 and bf16 products accumulate in
    float32, so this equals the bf16 product up to the order of the sums. Autograd records the
    casts, so the backward pass is float32 products on bf16-rounded values too, and the
    gradients reach the inputs rounded to bf16 as autocast's would. Products that PyTorch calls
    from C++ (inside ``einsum``, say) and calls with ``out=`` are left to autocast. For CPUs
    without native bf16, whose own bf16 products are ~100x slower than float32 ones.
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if (func not in _PRODUCTS or "out" in kwargs or not torch.is_autocast_enabled("cpu")
                or torch.get_autocast_dtype("cpu") != torch.bfloat16):
            return func(*args, **kwargs)
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, Tensor)]
        if not all(t.device.type == "cpu" and t.dtype in (torch.float32, torch.bfloat16) for t in tensors):
            return func(*args, **kwargs)
        with torch.autocast("cpu", enabled=False):
            out = func(*map(_bf16_valued, args), **{k: _bf16_valued(v) for k, v in kwargs.items()})
        return out.to(torch.bfloat16)


def precision_context(precision: str, device: str | torch.device) -> ContextManager:
    """The context the agents' forward passes run in: autocast to bf16 (with its products in
    float32 on a CPU without native bf16, :class:`Float32Bf16Products`), or nothing."""
    dtype = autocast_dtype(precision)
    if dtype is None:
        return contextlib.nullcontext()
    device_type = torch.device(device).type
    if device_type != "cpu" or cpu_has_native_bf16():
        return torch.autocast(device_type=device_type, dtype=dtype)
    return _cpu_autocast_with_float32_products(dtype)


@contextlib.contextmanager
def _cpu_autocast_with_float32_products(dtype: torch.dtype):
    with torch.autocast(device_type="cpu", dtype=dtype), Float32Bf16Products():
        yield

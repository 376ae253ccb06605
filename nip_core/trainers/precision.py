"""Arithmetic precision of the TensorDict trainers' agents (``rl.precision``).

``fp32``: everything in float32. ``bf16``: mixed precision, as the usual recipe: the
agents' forward passes (collection, value estimates, the loss's forward) run under
``torch.autocast(device_type, dtype=torch.bfloat16)`` on the CPU as on CUDA, so that the
matrix products run in bfloat16; the weights, gradients and optimiser state stay float32
(autocast casts the weights on the fly and the backward pass accumulates the weight
gradients in float32), and the agents return their logits and values in float32, so the
log-probabilities, ratios, advantages and losses are computed in float32.

``auto`` picks one of the two per machine (:func:`resolve_precision`), by what a whole GI
iteration measured on the paper workload (docs/performance.md), not by the GEMM peaks: today
that is float32 everywhere. On a CPU without native bf16 (no AVX512-BF16, no AMX) bf16
products run ~100x slower than float32 ones (0.7 against 76 GFLOP/s on an AMD EPYC, where a
GI iteration took 7.8x as long in bf16). On a CPU with it, the step is bound by memory and
by many small ops, and the C kernels compute in float32 either way: a bf16 iteration measured
at parity on an AMD EPYC with AVX512-BF16 and 4 % slower on an Intel Xeon with AMX (5.63
against 5.42 s per iteration), for less precision. On a CUDA GPU the eager step is bound by
the host, so bf16's casts made it slower (1.95 against 3.05 s per iteration on an H200). The
trainer records what it picked, and why, in the run's ``metadata.json`` (``precision``), and
the result card shows it.
"""

from __future__ import annotations

import contextlib
import logging
from typing import ContextManager

import torch

PRECISION_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
AUTO = "auto"
NO_NATIVE_BF16 = ("this CPU has no native bf16 (no AVX512-BF16, no AMX): bf16 products run far slower "
                  "than float32 ones here (docs/performance.md)")
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


def native_cpu_bf16() -> bool:
    """Whether this CPU computes bf16 dot products natively (AVX512-BF16 or AMX tiles)."""
    probes = (getattr(torch.cpu, "_is_avx512_bf16_supported", None), getattr(torch.cpu, "_is_amx_tile_supported", None))
    return any(probe is not None and bool(probe()) for probe in probes)


def resolve_precision(precision: str, device: str | torch.device) -> tuple[str, str]:
    """``(fp32 or bf16, why)``: ``precision`` itself, or what ``auto`` picks on ``device``.

    Raises
    ------
    ValueError
        If ``precision`` is not ``fp32``, ``bf16`` or ``auto`` (naming ``rl.precision``).
    """
    if precision != AUTO:
        autocast_dtype(precision)  # refuses an unknown one
        if precision == "bf16" and torch.device(device).type == "cpu" and not native_cpu_bf16():
            logger.warning("rl.precision=bf16: %s; rl.precision=auto would pick fp32", NO_NATIVE_BF16)
            return precision, f"rl.precision; {NO_NATIVE_BF16}"
        return precision, "rl.precision"
    device_type = torch.device(device).type
    if device_type != "cpu":
        return "fp32", f"auto: float32 on {device_type} (the eager step is bound by the host; bf16 measured slower)"
    if native_cpu_bf16():
        return "fp32", f"auto: {NATIVE_BF16_NO_FASTER}"
    return "fp32", f"auto: {NO_NATIVE_BF16}"


def precision_context(precision: str, device: str | torch.device) -> ContextManager:
    """The context the agents' forward passes run in: autocast to bf16, or nothing."""
    dtype = autocast_dtype(precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=dtype)

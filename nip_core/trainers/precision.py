"""Arithmetic precision of the TensorDict trainers' agents (``rl.precision``).

``fp32``: everything in float32. ``bf16``: mixed precision, as the usual recipe: the
agents' forward passes (collection, value estimates, the loss's forward) run under
``torch.autocast(device_type, dtype=torch.bfloat16)`` on the CPU as on CUDA, so that the
matrix products run in bfloat16; the weights, gradients and optimiser state stay float32
(autocast casts the weights on the fly and the backward pass accumulates the weight
gradients in float32), and the agents return their logits and values in float32, so the
log-probabilities, ratios, advantages and losses are computed in float32.
"""

from __future__ import annotations

import contextlib
from typing import ContextManager

import torch

PRECISION_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


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
                         f"(known: {sorted(PRECISION_DTYPES)})") from None
    return None if dtype == torch.float32 else dtype


def precision_context(precision: str, device: str | torch.device) -> ContextManager:
    """The context the agents' forward passes run in: autocast to bf16, or nothing."""
    dtype = autocast_dtype(precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=dtype)

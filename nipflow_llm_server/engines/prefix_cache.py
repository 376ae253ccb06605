"""Reusing the key/value cache of a conversation's earlier turns (the transformers engine).

A multi-turn episode sends its whole conversation again with every request: turn ``k``'s
prompt is turn ``k - 1``'s prompt, its reply and the next message. Without reuse, every turn
pays a prefill over the whole conversation, and prefill is most of the time of sampling on a
CPU (measured for SmolLM2-135M on two cores: 16 prompts of ~450 tokens take 22 s of prefill
and 12 s for 64 new tokens each; docs/text_backends.md#prefix-cache).

:class:`PrefixCache` keeps, per served model, the key/value tensors of the sequences generated
recently (prompt and reply), least recently used first out within a memory budget. A new row
takes the longest common token prefix it shares with any kept sequence (a conversation's
earlier turn, or just the system prompt and problem statement other rollouts share) and
prefills only the rest. The keys and values of a prefix do not depend on what follows it
(causal attention), so a reused prefix gives the same next-token distribution as a full
prefill, up to floating-point noise.

:func:`batched_past` lays the reused prefixes of a batch out as one cache: each row's prefix
right-aligned in a block of the longest prefix's width, left padding masked out; the new
tokens follow, left-padded too. :func:`row_kv` takes one row's real positions back out.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

#: Layers' ``(keys, values)`` of one sequence, each ``(kv_heads, tokens, head_dim)``.
KV = list[tuple[torch.Tensor, torch.Tensor]]

#: Prefixes shorter than this are not worth a lookup's copies.
MIN_REUSE_TOKENS = 16


@dataclass
class _Entry:
    tokens: torch.Tensor  # (T,) int64
    kv: KV
    nbytes: int


def _common_prefix(a: torch.Tensor, b: torch.Tensor) -> int:
    n = min(a.numel(), b.numel())
    if n == 0:
        return 0
    differ = (a[:n] != b[:n]).nonzero()
    return int(differ[0]) if differ.numel() else n


class PrefixCache:
    """Recent sequences' keys and values per model, within ``max_bytes`` (0: off).

    Used from the generation thread only (not thread-safe).
    """

    def __init__(self, max_bytes: int):
        self.max_bytes = int(max_bytes)
        self.nbytes = 0
        self._entries: OrderedDict[tuple[str, int], _Entry] = OrderedDict()
        self._next = 0
        self.reused_tokens = 0  # prompt tokens taken from the cache (for logs and tests)
        self.prefilled_tokens = 0  # prompt tokens computed

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, model: str, prompt: Sequence[int]) -> tuple[int, KV | None]:
        """``(n, kv)``: the longest kept prefix of ``prompt`` for ``model`` (at most all but its
        last token, which must be fed to get the next token's distribution), or ``(0, None)``."""
        if not self.max_bytes or len(prompt) <= MIN_REUSE_TOKENS:
            return 0, None
        wanted = torch.tensor(prompt, dtype=torch.long)
        best_n, best_key = 0, None
        for key, entry in self._entries.items():
            if key[0] != model:
                continue
            n = min(_common_prefix(entry.tokens, wanted), len(prompt) - 1)
            if n > best_n:
                best_n, best_key = n, key
        if best_key is None or best_n < MIN_REUSE_TOKENS:
            return 0, None
        self._entries.move_to_end(best_key)
        kv = [(k[:, :best_n], v[:, :best_n]) for k, v in self._entries[best_key].kv]
        return best_n, kv

    def put(self, model: str, tokens: Sequence[int], kv: KV) -> None:
        """Keep ``tokens``' keys and values; kept sequences that are prefixes of it go."""
        if not self.max_bytes or len(tokens) <= MIN_REUSE_TOKENS:
            return
        seq = torch.tensor(list(tokens), dtype=torch.long)
        nbytes = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)
        if nbytes > self.max_bytes:
            return
        for key in [k for k, e in self._entries.items()
                    if k[0] == model and e.tokens.numel() <= seq.numel() and _common_prefix(e.tokens, seq) == e.tokens.numel()]:
            self._drop(key)
        self._next += 1
        self._entries[(model, self._next)] = _Entry(seq, kv, nbytes)
        self.nbytes += nbytes
        while self.nbytes > self.max_bytes:
            self._drop(next(iter(self._entries)))

    def _drop(self, key: tuple[str, int]) -> None:
        self.nbytes -= self._entries.pop(key).nbytes


def batched_past(pasts: Sequence[tuple[int, KV | None]], prompts: Sequence[Sequence[int]], pad: int):
    """Inputs of a batch's prefill over reused prefixes.

    Returns ``(input_ids, attention, positions, past)``: ``input_ids`` ``(B, M)`` the tokens not
    reused (left-padded), ``attention`` ``(B, P + M)`` with zeros at padding, ``positions``
    ``(B, M)``, and ``past`` the layers' ``(keys, values)`` of width ``P`` (the longest reused
    prefix; each row's right-aligned), or None when no row reuses anything.
    """
    B = len(prompts)
    reused = [n for n, _ in pasts]
    P = max(reused)
    M = max(len(p) - n for p, n in zip(prompts, reused))
    input_ids = torch.full((B, M), pad, dtype=torch.long)
    attention = torch.zeros((B, P + M), dtype=torch.long)
    for i, (prompt, n) in enumerate(zip(prompts, reused)):
        rest = prompt[n:]
        input_ids[i, M - len(rest):] = torch.tensor(rest, dtype=torch.long)
        attention[i, P - n:P] = 1
        attention[i, P + M - len(rest):] = 1
    positions = (attention.cumsum(-1) - 1).clamp(min=0)[:, P:]
    if P == 0:
        return input_ids, attention, positions, None
    template = next(kv for _, kv in pasts if kv is not None)
    past = []
    for layer, (k0, v0) in enumerate(template):
        keys = k0.new_zeros((B, k0.shape[0], P, k0.shape[-1]))
        values = v0.new_zeros((B, v0.shape[0], P, v0.shape[-1]))
        for i, (n, kv) in enumerate(pasts):
            if n:
                keys[i, :, P - n:] = kv[layer][0]
                values[i, :, P - n:] = kv[layer][1]
        past.append((keys, values))
    return input_ids, attention, positions, past


def row_kv(layers: Sequence[tuple[torch.Tensor, torch.Tensor]], attention_row: torch.Tensor, length: int) -> KV:
    """Row's keys and values at its first ``length`` real (unmasked) positions, copied out of
    the batch's ``layers`` (each ``(keys, values)`` of this row alone: ``(kv_heads, T, head_dim)``)."""
    index = attention_row.nonzero().squeeze(-1)[:length]
    return [(k.index_select(1, index), v.index_select(1, index)) for k, v in layers]

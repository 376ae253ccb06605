"""Batched sampling for the transformers engine: rows, and the decode loop they share.

A :class:`DecodeBatch` decodes many rows (one per choice of a request) together, one new
token per row per forward pass with the key/value cache; rows join between steps and leave
when they finish (the queue that feeds it: :mod:`~nipflow_llm_server.engines.batching`).
Each row's prompt reuses the longest kept prefix of an earlier turn
(:mod:`~nipflow_llm_server.engines.prefix_cache`).

Every row is sampled with its own settings (temperature, nucleus ``top_p``, a
``torch.Generator`` seeded from the request's ``seed`` and the choice index, token limit,
stop strings), so a row's text does not depend on what it was batched with (up to
floating-point noise from the padding). Temperature 0 is greedy. A row with a ``matcher``
(structured output, :mod:`~nipflow_llm_server.engines.constraints`) samples only tokens the
matcher allows and stops when the required form is complete.

Why not ``model.generate``: a batch here mixes requests, and OpenAI's contract is per
request. transformers' sampling (5.23, ``GenerationMixin._sample``) takes one generation
config per call (one temperature, one ``top_p``) and draws every row with one
``torch.multinomial`` from the global random stream, so a seeded request's text would depend
on the requests it happened to be batched with. Keeping per-request seeds through
``generate`` would mean one call per distinct setting and seed, i.e. no batching, which is
what makes sampling on a CPU usable (``docs/text_backends.md``). The loop below uses the
model's own forward pass and key/value cache; only the choice of the next token is ours.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from nipflow_llm_server.engines.base import Generation, SamplingParams, TokenLogprob
from nipflow_llm_server.engines.constraints import mask_logits
from nipflow_llm_server.engines.prefix_cache import PrefixCache, batched_past, row_kv

log = logging.getLogger(__name__)

#: Completion tokens when a request gives no ``max_tokens`` (the context permitting).
DEFAULT_MAX_NEW_TOKENS = 512


@dataclass
class Row:
    """One sequence to generate (one choice of one request)."""

    prompt: list[int]
    max_new: int
    temperature: float
    top_p: float
    generator: torch.Generator
    stop: tuple[str, ...] = ()
    logprobs: bool = False
    top_logprobs: int = 0
    matcher: Any = None  # an llguidance matcher of this row alone, or None


def make_rows(prompt: list[int], params: SamplingParams, context: int,
              new_matcher: Callable[[], Any] | None = None) -> tuple[list[Row], int]:
    """Rows of a request and the prompt length used (prompts longer than the context lose
    their start: the end of a conversation is what the reply depends on most).
    ``new_matcher`` makes each row's constraint matcher (structured output)."""
    wanted = params.max_tokens or DEFAULT_MAX_NEW_TOKENS
    max_new = max(1, min(wanted, max(context - len(prompt), context // 2)))
    if len(prompt) + max_new > context:
        prompt = prompt[len(prompt) + max_new - context:]
    base_seed = params.seed if params.seed is not None else secrets.randbits(62)
    rows = []
    for choice in range(params.n):
        generator = torch.Generator().manual_seed((base_seed * 1_000_003 + choice) % (1 << 63))
        rows.append(Row(prompt, max_new, params.temperature, params.top_p, generator, params.stop,
                        params.logprobs, params.top_logprobs, new_matcher() if new_matcher else None))
    return rows, len(prompt)


def _sample(logits: torch.Tensor, row: Row) -> int:
    """One token id from a row's float32 CPU logits."""
    if row.temperature <= 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / row.temperature, dim=-1)
    if row.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_probs, dim=-1) - sorted_probs < row.top_p  # smallest set reaching top_p
        keep[0] = True
        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_probs[keep])
    return int(torch.multinomial(probs, 1, generator=row.generator))


def _token_logprob(logits: torch.Tensor, token: int, top: int, decode: Callable[[list[int]], str]) -> TokenLogprob:
    logp = torch.log_softmax(logits, dim=-1)  # the model's distribution (temperature 1)
    alternatives = ()
    if top:
        values, ids = torch.topk(logp, top)
        alternatives = tuple((decode([int(i)]), float(v)) for v, i in zip(values, ids))
    return TokenLogprob(token=decode([token]), logprob=float(logp[token]), top=alternatives)


@dataclass(eq=False)
class Running:
    """A row in a :class:`DecodeBatch`: what it has generated so far."""

    row: Row
    owner: Any  # whoever gets the generation (opaque to the batch)
    tokens: list[int] = field(default_factory=list)
    fed: list[int] = field(default_factory=list)  # tokens in the cache after the prompt
    logprobs: list[TokenLogprob] = field(default_factory=list)
    text: str | None = None
    finish: str | None = None

    def generation(self, decode: Callable[[list[int]], str]) -> Generation:
        text = self.text if self.text is not None else decode(self.tokens)
        return Generation(text=text, finish_reason=self.finish or "length", completion_tokens=len(self.tokens),
                          logprobs=tuple(self.logprobs) if self.row.logprobs else None)


class DecodeBatch:
    """Rows decoded together, one token each per :meth:`step`; rows join (:meth:`admit`) and
    leave (when they finish) between steps.

    The batch keeps one key/value cache: row ``i``'s sequence occupies the last columns of
    row ``i`` of the cache, left-padded and masked (``attention``). A joining group is
    prefilled on its own (reusing kept prefixes, :mod:`~nipflow_llm_server.engines.prefix_cache`)
    and its cache is concatenated to the batch's, the narrower of the two padded on the left.
    A finished row leaves the cache at once, so no step is spent on it, and its prompt and
    reply are kept in ``prefix_cache`` for the conversation's next turn.
    """

    def __init__(self, model: Any, tokenizer: Any, device: str, prefix_cache: PrefixCache | None = None,
                 model_key: str = ""):
        self.model, self.device = model, device
        self.prefix_cache, self.model_key = prefix_cache, model_key
        self.eos = tokenizer.eos_token_id
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos
        self.decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
        self.running: list[Running] = []
        self.cache: Any = None  # transformers' DynamicCache of the running rows
        self.attention = self.next_pos = self.logits = None

    def __len__(self) -> int:
        return len(self.running)

    @torch.no_grad()
    def admit(self, rows: Sequence[Row], owners: Sequence[Any]) -> None:
        """Prefill ``rows`` and add them to the batch (``owners[i]`` is ``rows[i]``'s)."""
        started = time.perf_counter()
        pc = self.prefix_cache
        pasts = [pc.lookup(self.model_key, r.prompt) if pc is not None else (0, None) for r in rows]
        input_ids, attention, positions, past = batched_past(pasts, [r.prompt for r in rows], self.pad)
        reused = sum(n for n, _ in pasts)
        if pc is not None:
            pc.reused_tokens += reused
            pc.prefilled_tokens += sum(len(r.prompt) for r in rows) - reused
        cache = None if past is None else _cache([(k.to(self.device), v.to(self.device)) for k, v in past])
        attention, positions = attention.to(self.device), positions.to(self.device)
        out = self.model(input_ids=input_ids.to(self.device), attention_mask=attention, position_ids=positions,
                         past_key_values=cache, use_cache=True)
        logits = out.logits[:, -1, :].float().cpu()
        log.info("admitted %d sequences (%d running): prefill of %d prompt tokens (%d more reused) in %.2f s",
                 len(rows), len(self.running) + len(rows), sum(len(r.prompt) for r in rows) - reused, reused,
                 time.perf_counter() - started)
        self._join(out.past_key_values, attention, positions[:, -1:] + 1, logits)
        self.running += [Running(row, owner) for row, owner in zip(rows, owners)]

    def _join(self, cache: Any, attention: torch.Tensor, next_pos: torch.Tensor, logits: torch.Tensor) -> None:
        if self.cache is None:
            self.cache, self.attention, self.next_pos, self.logits = cache, attention, next_pos, logits
            return
        width = max(self.attention.shape[1], attention.shape[1])

        def widen(t: torch.Tensor, dim_from_end: int) -> torch.Tensor:  # left-pad the time dimension to ``width``
            missing = width - t.shape[-dim_from_end]
            return t if missing == 0 else torch.nn.functional.pad(t, (0, 0) * (dim_from_end - 1) + (missing, 0))

        layers = [(torch.cat([widen(a.keys, 2), widen(b.keys, 2)]), torch.cat([widen(a.values, 2), widen(b.values, 2)]))
                  for a, b in zip(self.cache.layers, cache.layers)]
        self.cache = _cache(layers)
        self.attention = torch.cat([widen(self.attention, 1), widen(attention, 1)])
        self.next_pos = torch.cat([self.next_pos, next_pos])
        self.logits = torch.cat([self.logits, logits])

    @torch.no_grad()
    def step(self) -> list[Running]:
        """One token for every running row; returns the rows that finished (they leave)."""
        if not self.running:
            return []
        feed = [self._choose(i, r) for i, r in enumerate(self.running)]
        done = [i for i, r in enumerate(self.running) if r.finish is not None]
        if self.prefix_cache is not None:
            layers = [(layer.keys, layer.values) for layer in self.cache.layers]
            for i in done:
                r = self.running[i]
                kept = list(r.row.prompt) + r.fed
                self.prefix_cache.put(self.model_key, kept,
                                      row_kv([(k[i], v[i]) for k, v in layers], self.attention[i], len(kept)))
        finished = [self.running[i] for i in done]
        keep = [i for i, r in enumerate(self.running) if r.finish is None]
        self._retain(keep)
        if not keep:
            return finished
        feed = [feed[i] for i in keep]
        for r, token in zip(self.running, feed):
            r.fed.append(token)
        self.attention = torch.cat([self.attention, self.attention.new_ones((len(keep), 1))], dim=1)
        out = self.model(input_ids=torch.tensor(feed, dtype=torch.long, device=self.device)[:, None],
                         attention_mask=self.attention, position_ids=self.next_pos, past_key_values=self.cache,
                         use_cache=True)
        self.cache, self.logits = out.past_key_values, out.logits[:, -1, :].float().cpu()
        self.next_pos = self.next_pos + 1
        return finished

    def drop(self, gone: Callable[[Any], bool]) -> int:
        """Rows whose owner ``gone`` names leave unfinished (nobody waits for them any more:
        their client disconnected); returns how many left. The others go on as if the
        dropped rows had never been there."""
        keep = [i for i, r in enumerate(self.running) if not gone(r.owner)]
        dropped = len(self.running) - len(keep)
        if dropped:
            self._retain(keep)
        return dropped

    def _retain(self, keep: list[int]) -> None:
        """Only rows ``keep`` (indices into ``running``, in order) stay."""
        if len(keep) == len(self.running):
            return
        if not keep:
            self.running, self.cache = [], None
            self.attention = self.next_pos = self.logits = None
            return
        self._keep(keep)
        self.running = [self.running[i] for i in keep]

    def _keep(self, keep: list[int]) -> None:
        """Only the cache rows ``keep`` stay; columns no remaining row uses go."""
        index = torch.tensor(keep, dtype=torch.long, device=self.attention.device)
        attention = self.attention.index_select(0, index)
        first = int(attention.any(0).nonzero()[0])
        self.attention, self.next_pos = attention[:, first:], self.next_pos.index_select(0, index)
        self.logits = self.logits.index_select(0, index.cpu())
        self.cache = _cache([(layer.keys.index_select(0, index)[:, :, first:],
                              layer.values.index_select(0, index)[:, :, first:]) for layer in self.cache.layers])

    def _choose(self, i: int, r: Running) -> int:
        """Row ``r``'s next token (from row ``i`` of the logits); sets ``r.finish`` when it ends."""
        row, logits = r.row, self.logits[i]
        token = _sample(logits if row.matcher is None else mask_logits(logits, row.matcher), row)
        if row.matcher is not None and not row.matcher.consume_token(token):
            raise RuntimeError(f"structured output: token {token} refused: {row.matcher.get_error()}")
        if token == self.eos:
            r.finish = "stop"
            return token
        r.tokens.append(token)
        if row.logprobs:
            r.logprobs.append(_token_logprob(logits, token, row.top_logprobs, self.decode))
        if row.matcher is not None and row.matcher.is_stopped():  # the form is complete
            r.finish = "stop"
        elif row.stop:
            text = self.decode(r.tokens)
            cut = min((text.find(s) for s in row.stop if s and s in text), default=-1)
            if cut >= 0:
                r.text, r.finish = text[:cut], "stop"
        if r.finish is None and len(r.tokens) >= row.max_new:
            r.finish = "length"
        return token


def _cache(layers: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> Any:
    from transformers import DynamicCache

    return DynamicCache(ddp_cache_data=list(layers))


def generate_rows(model: Any, tokenizer: Any, rows: Sequence[Row], device: str,
                  prefix_cache: PrefixCache | None = None, model_key: str = "") -> list[Generation]:
    """Generate ``rows`` together in one :class:`DecodeBatch` (that no row joins later)."""
    batch = DecodeBatch(model, tokenizer, device, prefix_cache, model_key)
    batch.admit(rows, range(len(rows)))
    result: list[Generation | None] = [None] * len(rows)
    while len(batch):
        for r in batch.step():
            result[r.owner] = r.generation(batch.decode)
    return result  # type: ignore[return-value]

"""Batched sampling for the transformers engine: a batching queue and a decode loop.

:class:`Batcher` runs one generation thread. A request waits at most ``window_s`` for
others to join it; the requests gathered (up to ``max_batch`` sequences, a request with
``n`` choices counting ``n``) are grouped by model and each group is generated together:
prompts padded on the left, one forward pass per new token with the key/value cache.

:func:`generate_rows` samples every row with its own settings (temperature, nucleus
``top_p``, a ``torch.Generator`` seeded from the request's ``seed`` and the choice index,
token limit, stop strings), so a row's text does not depend on what it was batched with
(up to floating-point noise from the padding). Temperature 0 is greedy. A row with a
``matcher`` (structured output, :mod:`~nipflow_llm_server.engines.constraints`) samples only
tokens the matcher allows and stops when the required form is complete.

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

import asyncio
import logging
import queue
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from nipflow_llm_server.engines.base import Generation, SamplingParams, TokenLogprob
from nipflow_llm_server.engines.constraints import mask_logits

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


@torch.no_grad()
def generate_rows(model: Any, tokenizer: Any, rows: Sequence[Row], device: str) -> list[Generation]:
    """Generate all ``rows`` together (see the module docstring)."""
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    width = max(len(r.prompt) for r in rows)
    input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        input_ids[i, width - len(row.prompt):] = torch.tensor(row.prompt, dtype=torch.long)
        attention[i, width - len(row.prompt):] = 1
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    input_ids, attention, positions = input_ids.to(device), attention.to(device), positions.to(device)
    out = model(input_ids=input_ids, attention_mask=attention, position_ids=positions, use_cache=True)
    cache, logits = out.past_key_values, out.logits[:, -1, :].float().cpu()
    next_pos = positions[:, -1:] + 1
    tokens: list[list[int]] = [[] for _ in rows]
    lps: list[list[TokenLogprob]] = [[] for _ in rows]
    texts: list[str | None] = [None] * len(rows)
    finish: list[str | None] = [None] * len(rows)
    for step in range(max(r.max_new for r in rows)):
        feed = []
        for i, row in enumerate(rows):
            if finish[i] is not None:
                feed.append(pad)
                continue
            token = _sample(logits[i] if row.matcher is None else mask_logits(logits[i], row.matcher), row)
            feed.append(token)
            if row.matcher is not None and not row.matcher.consume_token(token):
                raise RuntimeError(f"structured output: token {token} refused: {row.matcher.get_error()}")
            if token == eos:
                finish[i] = "stop"
                continue
            tokens[i].append(token)
            if row.logprobs:
                lps[i].append(_token_logprob(logits[i], token, row.top_logprobs, decode))
            if row.matcher is not None and row.matcher.is_stopped():  # the form is complete
                finish[i] = "stop"
                continue
            if row.stop:
                text = decode(tokens[i])
                cut = min((text.find(s) for s in row.stop if s and s in text), default=-1)
                if cut >= 0:
                    texts[i], finish[i] = text[:cut], "stop"
                    continue
            if len(tokens[i]) >= row.max_new:
                finish[i] = "length"
        if all(f is not None for f in finish):
            break
        attention = torch.cat([attention, torch.ones((len(rows), 1), dtype=torch.long, device=device)], dim=1)
        step_ids = torch.tensor(feed, dtype=torch.long, device=device)[:, None]
        out = model(input_ids=step_ids, attention_mask=attention, position_ids=next_pos, past_key_values=cache,
                    use_cache=True)
        cache, logits = out.past_key_values, out.logits[:, -1, :].float().cpu()
        next_pos = next_pos + 1
    result = []
    for i, row in enumerate(rows):
        text = texts[i] if texts[i] is not None else decode(tokens[i])
        result.append(Generation(text=text, finish_reason=finish[i] or "length", completion_tokens=len(tokens[i]),
                                 logprobs=tuple(lps[i]) if row.logprobs else None))
    return result


@dataclass
class _Pending:
    key: Any  # requests with the same key share a forward pass (the same loaded model)
    rows: list[Row]
    run: Callable[[list[Row]], list[Generation]]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future


class Batcher:
    """The batching queue (see the module docstring).

    Parameters
    ----------
    window_s
        How long the first request of a batch waits for others.
    max_batch
        Sequences generated together at most.
    """

    def __init__(self, window_s: float, max_batch: int):
        self.window_s = window_s
        self.max_batch = max_batch
        self.batch_sizes: list[int] = []  # sequences of each forward group, for tests and logs
        self._queue: queue.Queue[_Pending | None] = queue.Queue()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="generation", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout)
            self._thread = None

    async def submit(self, key: Any, rows: list[Row], run: Callable[[list[Row]], list[Generation]]) -> list[Generation]:
        """Generate ``rows`` with ``run`` (called on the generation thread with the rows of
        every request of the same ``key`` in the batch); returns this request's generations."""
        self.start()
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._queue.put(_Pending(key, rows, run, loop, future))
        return await future

    def _gather(self, first: _Pending) -> tuple[list[_Pending], bool]:
        batch, size = [first], len(first.rows)
        deadline = time.monotonic() + self.window_s
        while size < self.max_batch:
            left = deadline - time.monotonic()
            try:
                item = self._queue.get(timeout=left) if left > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if item is None:
                return batch, True
            batch.append(item)
            size += len(item.rows)
        return batch, False

    def _loop(self) -> None:
        stopping = False
        while not stopping:
            first = self._queue.get()
            if first is None:
                return
            batch, stopping = self._gather(first)
            groups: dict[Any, list[_Pending]] = {}
            for item in batch:
                groups.setdefault(item.key, []).append(item)
            for items in groups.values():
                self._run_group(items)

    def _run_group(self, items: list[_Pending]) -> None:
        rows = [row for item in items for row in item.rows]
        try:
            generations: list[Generation] = []
            for start in range(0, len(rows), self.max_batch):  # one request may hold more rows than a batch
                chunk = rows[start:start + self.max_batch]
                self.batch_sizes.append(len(chunk))
                generations.extend(items[0].run(chunk))
        except Exception as exc:  # every waiting request learns of the failure
            log.exception("generation failed for a batch of %d sequences", len(rows))
            for item in items:
                item.loop.call_soon_threadsafe(_settle, item.future, None, exc)
            return
        offset = 0
        for item in items:
            mine = generations[offset:offset + len(item.rows)]
            offset += len(item.rows)
            item.loop.call_soon_threadsafe(_settle, item.future, mine, None)


def _settle(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if future.cancelled():  # the client went away
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)

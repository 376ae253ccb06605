"""The local model family: a response-selection policy over candidate responses.

This is not a language model. For a conversation ``p`` the model builds a pool of
candidate responses (:mod:`~nipflow_llm_server.policy.candidates`: generated from the format
markers of the prompt, see :mod:`~nipflow_llm_server.policy.formats`, plus the responses it
learned in fine-tuning whose kind the prompt allows) and scores each candidate ``c`` with
the hashed linear function of :mod:`~nipflow_llm_server.policy.features`. It samples
``softmax(score / temperature)`` with nucleus (``top_p``) truncation, seeded when the
request has a ``seed``. Token-level ``logprobs`` are those the response distribution
(at temperature 1) induces on the tokens of the chosen response.

A base model is its name, a seed, and weights drawn from ``N(0, INIT_SCALE^2)`` with
that seed; different base names thus start with different (mild) preferences. A
fine-tuned model is its weights after training plus its learned responses, kept in the
server's data directory.
"""

from __future__ import annotations

import hashlib
import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Any

import numpy as np

from nipflow_llm_server.policy.candidates import Candidate, build_pool
from nipflow_llm_server.policy.features import DIM, PromptFeatures, plan, prompt_features, string_hash
from nipflow_llm_server.policy.formats import ResponseFormat, detect_format
from nipflow_llm_server.policy.tokenizer import split_tokens

INIT_SCALE = 0.3
MEMORY_LIMIT = 2048

#: Base model names served by the local server, mapped to their canonical snapshot name.
BASE_MODEL_ALIASES: dict[str, str] = {
    "gpt-4o-mini-2024-07-18": "gpt-4o-mini-2024-07-18",
    "gpt-4o-mini": "gpt-4o-mini-2024-07-18",
    "gpt-4o-2024-08-06": "gpt-4o-2024-08-06",
    "gpt-4o": "gpt-4o-2024-08-06",
    "gpt-4.1-mini-2025-04-14": "gpt-4.1-mini-2025-04-14",
    "gpt-4.1-mini": "gpt-4.1-mini-2025-04-14",
    "gpt-4.1-nano-2025-04-14": "gpt-4.1-nano-2025-04-14",
    "gpt-4.1-2025-04-14": "gpt-4.1-2025-04-14",
    "gpt-3.5-turbo": "gpt-3.5-turbo-0125",
    "gpt-3.5-turbo-0125": "gpt-3.5-turbo-0125",
}


def canonical_base(name: str) -> str | None:
    """Canonical snapshot name of a base model name, or ``None`` if it is not one."""
    return BASE_MODEL_ALIASES.get(name)


@lru_cache(maxsize=8)
def base_weights(canonical: str) -> np.ndarray:
    """Initial weights of a base model (read-only; seeded by the canonical name)."""
    rng = np.random.default_rng(string_hash("base|" + canonical))
    weights = (rng.standard_normal(DIM, dtype=np.float32) * np.float32(INIT_SCALE)).astype(np.float32)
    weights.flags.writeable = False
    return weights


@dataclass(frozen=True)
class TokenLogprob:
    """Log-probability of one emitted token, with the most likely alternatives."""

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class Generation:
    """One sampled response."""

    text: str
    finish_reason: str
    completion_tokens: int
    logprobs: tuple[TokenLogprob, ...] | None = None


@dataclass
class Evaluation:
    """A prompt's candidate pool with its scores."""

    fmt: ResponseFormat
    features: PromptFeatures
    candidates: list[Candidate]
    scores: np.ndarray  # (n_candidates,) float64


def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max()
    e = np.exp(z)
    return e / e.sum()


def nucleus(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Probabilities restricted to the smallest top set with mass >= ``top_p``."""
    if top_p >= 1.0:
        return probs
    order = np.argsort(-probs, kind="stable")
    cumulative = np.cumsum(probs[order])
    keep = int(np.searchsorted(cumulative, top_p) + 1)
    out = np.zeros_like(probs)
    out[order[:keep]] = probs[order[:keep]]
    return out / out.sum()


@dataclass
class PolicyModel:
    """A model of the local family: weights and learned responses.

    Parameters
    ----------
    name
        Model id as served (a base name or an ``ft:`` name).
    base
        Canonical base model the lineage started from.
    weights
        ``(DIM,)`` float32 weight vector (treated as read-only).
    memory
        Responses learned in fine-tuning (most recent last).
    """

    name: str
    base: str
    weights: np.ndarray
    memory: tuple[Candidate, ...] = field(default_factory=tuple)

    @classmethod
    def base_model(cls, name: str) -> "PolicyModel":
        canonical = canonical_base(name)
        if canonical is None:
            raise KeyError(name)
        return cls(name=name, base=canonical, weights=base_weights(canonical))

    def evaluate(self, messages: Sequence[Mapping[str, Any]], extra: tuple[Candidate, ...] = ()) -> Evaluation:
        """Build the candidate pool of a conversation and score it."""
        fmt = detect_format(messages)
        features = prompt_features(messages)
        pool = build_pool(fmt, list(self.memory), extra)
        scores = plan(features, pool).scores(self.weights)
        return Evaluation(fmt=fmt, features=features, candidates=pool, scores=scores)

    @cached_property
    def identity(self) -> int:
        """What seeds this model's sampling: its name for a base model, else what it learned.

        A fine-tuned model's name carries the job's random id; seeding by its weights and
        learned responses instead makes two identical runs sample the same after a fine-tune
        (the field probes of #29 compare such runs).
        """
        if canonical_base(self.name) is not None:
            return string_hash(self.name)
        learned = hashlib.sha256(self.base.encode() + np.ascontiguousarray(self.weights).tobytes())
        for candidate in self.memory:
            learned.update(f"\0{candidate.kind}\0{candidate.template}\0{candidate.text}".encode())
        return int.from_bytes(learned.digest()[:4], "little")

    def _rng(self, seed: int | None, features: PromptFeatures) -> np.random.Generator:
        if seed is None:
            return np.random.default_rng()
        digest = zlib.crc32(features.ids.tobytes())
        return np.random.default_rng([seed % (1 << 63), self.identity, digest])

    def generate(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        n: int = 1,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
        max_tokens: int | None = None,
        stop: Sequence[str] = (),
        logprobs: bool = False,
        top_logprobs: int = 0,
    ) -> list[Generation]:
        """Sample ``n`` responses to ``messages`` (see the module docstring)."""
        ev = self.evaluate(messages)
        if temperature <= 0:
            probs = np.zeros(len(ev.candidates))
            probs[int(np.argmax(ev.scores))] = 1.0
        else:
            probs = nucleus(softmax(ev.scores / temperature), top_p)
        rng = self._rng(seed, ev.features)
        picks = rng.choice(len(ev.candidates), size=n, p=probs)
        model_probs = softmax(ev.scores) if logprobs else None
        out = []
        for pick in picks:
            out.append(self._finish(ev, int(pick), max_tokens, stop, model_probs, top_logprobs))
        return out

    def _finish(
        self,
        ev: Evaluation,
        pick: int,
        max_tokens: int | None,
        stop: Sequence[str],
        model_probs: np.ndarray | None,
        top_logprobs: int,
    ) -> Generation:
        text = ev.candidates[pick].text
        finish = "stop"
        cut = min((text.find(s) for s in stop if s and s in text), default=-1)
        if cut >= 0:
            text = text[:cut]
        tokens = split_tokens(text)
        if max_tokens is not None and len(tokens) > max_tokens:
            tokens = tokens[:max_tokens]
            text = "".join(tokens)
            finish = "length"
        lps = None
        if model_probs is not None:
            lps = token_logprobs(tokens, [split_tokens(c.text) for c in ev.candidates], model_probs, top_logprobs)
        return Generation(text=text, finish_reason=finish, completion_tokens=len(tokens), logprobs=lps)


def token_logprobs(
    tokens: Sequence[str], candidate_tokens: Sequence[Sequence[str]], probs: np.ndarray, top: int
) -> tuple[TokenLogprob, ...]:
    """Token log-probabilities the candidate distribution induces along ``tokens``.

    ``P(t_i | t_<i)`` is the mass of candidates starting with ``t_<=i`` over the mass of
    candidates starting with ``t_<i``.
    """
    alive = [i for i in range(len(candidate_tokens)) if probs[i] > 0]
    out = []
    for pos, token in enumerate(tokens):
        mass: dict[str, float] = {}
        total = 0.0
        for i in alive:
            total += probs[i]
            if len(candidate_tokens[i]) > pos:
                nxt = candidate_tokens[i][pos]
                mass[nxt] = mass.get(nxt, 0.0) + float(probs[i])
        chosen = mass.get(token, 0.0)
        logprob = math.log(chosen / total) if chosen > 0 and total > 0 else -9999.0
        alts = sorted(mass.items(), key=lambda kv: -kv[1])[:top] if top else []
        out.append(
            TokenLogprob(token=token, logprob=logprob, top=tuple((t, math.log(m / total)) for t, m in alts))
        )
        alive = [i for i in alive if len(candidate_tokens[i]) > pos and candidate_tokens[i][pos] == token]
    return tuple(out)

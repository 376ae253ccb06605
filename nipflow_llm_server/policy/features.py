"""Hashed features of prompts and candidates (the inputs of the local model's score).

Everything is hashed into one weight vector ``W`` of ``DIM`` floats.

*Prompt features* ``x`` (a sparse vector of unit L2 norm):

* each message is a *block*; all blocks get the same share of the norm (so a short
  question is not drowned by a long system prompt shared by every conversation);
* inside a block, ``1 - EXACT_SHARE`` of the squared norm goes to the lower-cased word
  unigrams and bigrams of the message (the code and problem text included), salted with
  the message's role and speaker name (the same word from the system prompt, the user or
  ``Expert_1`` is a different feature); the last message also contributes unigrams salted
  "last";
* ``EXACT_SHARE`` (0.9) of the block's squared norm goes to one feature for the message's
  exact text, and ``CONVERSATION_SHARE`` (0.3) of the whole norm to one feature for the exact
  whole conversation. These let the model *memorise* answers to prompts (and to system
  prompts, i.e. code-validation datapoints) seen in training, which plain n-grams of
  near-identical prompts (a correct solution and its one-token bug) cannot do; the
  n-gram part is what carries over, weakly, to prompts never seen.

*Candidate keys* ``K(c)``: the candidate's exact text, its template label and its kind.

The *score* of candidate ``c`` is ``sum_{g in K(c)} sum_f x_f W[h(f, g)]`` (a linear
function of prompt-feature x key crosses: for the two decision candidates it is a
logistic regression on the prompt's features) plus small prompt-independent biases
``BIAS_SCALE * W[h(g)]`` for its keys and ``BIAS_SCALE * W[h(u)] / sqrt(n)`` for its
``n`` word unigrams.

Hashes are crc32 of the strings mixed with splitmix64, so they are the same in every
process (Python's ``hash`` is salted per process).
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from nipflow_llm_server.policy.candidates import Candidate
from nipflow_llm_server.policy.tokenizer import message_text, words

DIM_BITS = 19
DIM = 1 << DIM_BITS
_MASK = np.uint64(DIM - 1)
_C1 = np.uint64(0xBF58476D1CE4E5B9)
_C2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)

_BIGRAM_SALT = np.uint64(0x5BD1E995)
_BIAS_SALT = np.uint64(0x1B873593)
_UNIGRAM_SALT = np.uint64(0xCC9E2D51)
_EXACT_SALT = np.uint64(0xE6546B64)
_CONVERSATION_SALT = np.uint64(0x85EBCA6B)
# the prompt-independent terms are kept small: they move every prompt's answer at once
BIAS_SCALE = 0.3
#: share of a message block's squared norm given to its exact-text feature (rest: n-grams)
EXACT_SHARE = 0.9
#: share of the prompt's squared norm given to the whole-conversation feature
CONVERSATION_SHARE = 0.3
_GRAM_VALUE = float(np.sqrt(1 - EXACT_SHARE))
_EXACT_VALUE = float(np.sqrt(EXACT_SHARE))


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser, elementwise on a uint64 array."""
    x = x + _GOLDEN
    x = (x ^ (x >> _S30)) * _C1
    x = (x ^ (x >> _S27)) * _C2
    return x ^ (x >> _S31)


def combine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Hash of pairs (broadcasting), uint64."""
    return _mix(_mix(a) ^ b)


@lru_cache(maxsize=200_000)
def string_hash(text: str) -> int:
    """A stable 32-bit hash of a string."""
    return zlib.crc32(text.encode("utf-8"))


def _hash_words(tokens: Sequence[str]) -> np.ndarray:
    return np.fromiter((string_hash(t) for t in tokens), dtype=np.uint64, count=len(tokens))


@dataclass(frozen=True)
class PromptFeatures:
    """Sorted unique feature ids of a prompt and their values (unit L2 norm)."""

    ids: np.ndarray  # (n,) uint64
    values: np.ndarray  # (n,) float64

    @property
    def size(self) -> int:
        return int(self.ids.size)


def prompt_features(messages: Sequence[Mapping[str, Any]]) -> PromptFeatures:
    """Hashed features of a conversation (see the module docstring).

    Each message is a block of equal weight: its features share ``1/M`` of the squared
    norm (``M`` messages), so that a short question is not drowned by a long system
    prompt that every conversation of a task shares.
    """
    ids_parts, val_parts = [], []
    conversation = 0
    last = len(messages) - 1
    with np.errstate(over="ignore"):
        for i, message in enumerate(messages):
            text = message_text(message)
            toks = _hash_words(words(text))
            role = f"{message.get('role', '')}|{message.get('name') or ''}"
            salt = np.uint64(string_hash(role))
            exact = np.array([combine(_EXACT_SALT ^ salt, np.uint64(string_hash(text)))], dtype=np.uint64)
            conversation = int(combine(np.uint64(conversation), exact[0]))
            parts = [combine(salt, toks)]
            if toks.size > 1:
                parts.append(combine(combine(salt ^ _BIGRAM_SALT, toks[:-1]), toks[1:]))
            if i == last:
                parts.append(combine(np.uint64(string_hash("last|" + role)), toks))
            grams = np.unique(np.concatenate(parts))
            ids_parts += [grams, exact]
            if grams.size:
                val_parts += [np.full(grams.size, _GRAM_VALUE / np.sqrt(grams.size)), np.full(1, _EXACT_VALUE)]
            else:
                val_parts += [grams.astype(np.float64), np.ones(1)]
    if not ids_parts:
        return PromptFeatures(np.zeros(1, dtype=np.uint64), np.ones(1))
    ids = np.concatenate(ids_parts)
    vals = np.concatenate(val_parts)
    uniq, inv = np.unique(ids, return_inverse=True)
    summed = np.bincount(inv, weights=vals)
    summed *= np.sqrt(1.0 - CONVERSATION_SHARE) / np.linalg.norm(summed)
    with np.errstate(over="ignore"):
        conv_id = combine(_CONVERSATION_SALT, np.uint64(conversation))
    pos = int(np.searchsorted(uniq, conv_id))
    return PromptFeatures(np.insert(uniq, pos, conv_id), np.insert(summed, pos, np.sqrt(CONVERSATION_SHARE)))


@dataclass(frozen=True)
class CandidateCode:
    """The hashed parts of one candidate: its three keys and its bias indices/values."""

    keys: np.ndarray  # (3,) uint64: text, template, kind
    bias_index: np.ndarray  # (3 + n_unigrams,) int64 indices into W
    bias_value: np.ndarray  # (3 + n_unigrams,) float32


@lru_cache(maxsize=50_000)
def encode_candidate(candidate: Candidate) -> CandidateCode:
    """Keys and bias features of a candidate (cached: the banks repeat across requests)."""
    keys = np.array(
        [string_hash("text|" + candidate.text), string_hash("tpl|" + candidate.template), string_hash("kind|" + candidate.kind)],
        dtype=np.uint64,
    )
    with np.errstate(over="ignore"):
        uni = np.unique(_hash_words(words(candidate.text)))
        key_bias = combine(_BIAS_SALT, keys) & _MASK
        uni_bias = combine(_UNIGRAM_SALT, uni) & _MASK
    uni_value = np.full(uni.size, 1.0 / np.sqrt(max(uni.size, 1)), dtype=np.float32)
    return CandidateCode(
        keys=keys,
        bias_index=np.concatenate([key_bias, uni_bias]).astype(np.int64),
        bias_value=np.concatenate([np.full(3, BIAS_SCALE, dtype=np.float32), uni_value * np.float32(BIAS_SCALE)]),
    )


@dataclass
class ScoringPlan:
    """Index arrays to score a set of candidates against one prompt.

    ``cross_index[f, k]`` is the weight index of (prompt feature f, unique key k);
    ``key_of[c]`` the three unique-key positions of candidate ``c``.
    """

    x: np.ndarray  # (n_features,) float64 feature values
    cross_index: np.ndarray  # (n_features, n_keys) int64
    key_of: np.ndarray  # (n_candidates, 3) int64
    bias_index: np.ndarray  # (n_bias,) int64, all candidates' bias features concatenated
    bias_value: np.ndarray  # (n_bias,) float32
    bias_owner: np.ndarray  # (n_bias,) int64, the candidate each bias feature belongs to

    def scores(self, weights: np.ndarray) -> np.ndarray:
        """Scores of the candidates under ``weights`` (float64, shape (n_candidates,))."""
        cross = self.x @ weights[self.cross_index]  # (n_keys,)
        out = cross[self.key_of].sum(axis=1)
        bias = np.bincount(self.bias_owner, weights=weights[self.bias_index] * self.bias_value, minlength=out.size)
        return out + bias

    def gradient(self, dscores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(indices, values) of d(sum_c dscores[c] * score_c) / dW, with repeats."""
        n_keys = self.cross_index.shape[1]
        dkey = np.zeros(n_keys, dtype=np.float64)
        np.add.at(dkey, self.key_of.ravel(), np.repeat(dscores, 3))
        active = np.nonzero(dkey)[0]
        cross_idx = self.cross_index[:, active].ravel()
        cross_val = np.outer(self.x, dkey[active]).ravel()
        bias_val = self.bias_value * dscores[self.bias_owner]
        return np.concatenate([cross_idx, self.bias_index]), np.concatenate([cross_val, bias_val])


def plan(features: PromptFeatures, candidates: Sequence[Candidate]) -> ScoringPlan:
    """A :class:`ScoringPlan` for ``candidates`` given the prompt ``features``."""
    codes = [encode_candidate(c) for c in candidates]
    all_keys = np.concatenate([code.keys for code in codes])
    unique_keys, inverse = np.unique(all_keys, return_inverse=True)
    with np.errstate(over="ignore"):
        cross = (combine(features.ids[:, None], unique_keys[None, :]) & _MASK).astype(np.int64)
    return ScoringPlan(
        x=features.values,
        cross_index=cross,
        key_of=inverse.reshape(len(codes), 3).astype(np.int64),
        bias_index=np.concatenate([code.bias_index for code in codes]),
        bias_value=np.concatenate([code.bias_value for code in codes]),
        bias_owner=np.repeat(np.arange(len(codes)), [code.bias_index.size for code in codes]),
    )


def sum_duplicates(index: np.ndarray, value: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unique indices and the summed values of each (a sparse gradient, coalesced)."""
    uniq, inv = np.unique(index, return_inverse=True)
    return uniq, np.bincount(inv, weights=value)


class Adagrad:
    """Adagrad on a dense weight vector with sparse gradients.

    Per-coordinate step sizes matter here: the features that tell prompts apart (the
    code, the question) are rarer than the shared instructions, and plain SGD on such
    correlated features learns them very slowly.
    """

    def __init__(self, weights: np.ndarray, step: float, initial: float = 1.0):
        self.weights = weights
        self.step = step
        self.accumulator = np.full_like(weights, initial)

    def update(self, index: np.ndarray, value: np.ndarray) -> None:
        if index.size == 0:
            return
        uniq, grad = sum_duplicates(index, value)
        acc = self.accumulator[uniq] + (grad * grad).astype(np.float32)
        self.accumulator[uniq] = acc
        self.weights[uniq] -= (self.step * grad / np.sqrt(acc)).astype(self.weights.dtype)

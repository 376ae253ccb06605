"""The simple tokenizer of the local model family.

A token is a run of word characters or a single punctuation character, together with
the whitespace before it, so that concatenating the tokens of a text gives the text
back (trailing whitespace forms a last token of its own). It is used for every token
count the local server reports (``usage``, ``trained_tokens``), for ``max_tokens``
truncation and for token-level ``logprobs``. Counts are therefore comparable with each
other, not with OpenAI's BPE counts (which are usually somewhat lower for English).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

_TOKEN_RE = re.compile(r"\s*(?:\w+|[^\w\s])|\s+$")
_WORD_RE = re.compile(r"\w+|[^\w\s]")

# OpenAI's accounting adds a few tokens per message for the role and separators.
TOKENS_PER_MESSAGE = 3
TOKENS_PER_PROMPT = 3


def split_tokens(text: str) -> list[str]:
    """Tokens of ``text`` including leading whitespace; ``"".join`` gives ``text`` back."""
    return _TOKEN_RE.findall(text)


def words(text: str) -> list[str]:
    """Lower-cased tokens without whitespace (the unit of the hashed n-gram features)."""
    return _WORD_RE.findall(text.lower())


def count_tokens(text: str) -> int:
    """Number of tokens of ``text``."""
    return len(_TOKEN_RE.findall(text))


def message_text(message: Mapping[str, Any]) -> str:
    """The text of a chat message: a string, or the ``text`` parts of a content list."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if isinstance(part, Mapping) and isinstance(part.get("text"), str):
            parts.append(part["text"])
    return "".join(parts)


def count_message_tokens(messages: Iterable[Mapping[str, Any]]) -> int:
    """Token count of a list of chat messages, with the per-message overhead."""
    total = 0
    for message in messages:
        total += TOKENS_PER_MESSAGE + count_tokens(message_text(message))
        if message.get("name"):
            total += 1
    return total


def count_prompt_tokens(messages: Iterable[Mapping[str, Any]]) -> int:
    """``usage.prompt_tokens`` of a chat completion request."""
    return count_message_tokens(messages) + TOKENS_PER_PROMPT

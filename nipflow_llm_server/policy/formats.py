"""Which kinds of response a prompt asks for (the format convention of the local model).

The local model is a response-selection policy (see :mod:`nipflow_llm_server.policy.model`):
it answers with one of a set of candidate responses. Which candidates it considers is
read from the *format markers* in the system messages of the prompt:

==============================================  =========================================
marker (in a system or developer message)       candidates
==============================================  =========================================
``Decision: accept`` or ``Decision: reject``    ``Decision: accept``, ``Decision: reject``
``Question for <Name>:`` (``[A-Za-z0-9_]+``)    one question per header found, one header
                                                per line, in order of first appearance
``Answer:``                                     ``Answer: ...`` arguments, for the stance
                                                the prompt asks the agent to argue (below)
a *must-decide* phrase (below)                  decision candidates only
none                                            short generic replies
==============================================  =========================================

The markers are read from the **most recent** system message that contains any marker,
else from the first system message. Markers are case-sensitive, as written above, and
they combine: a verifier prompt with ``Question for Expert:`` and ``Decision: accept``
gets questions and decisions. A prompt should therefore mention only the markers of the
responses the agent itself may give.

*Must-decide* phrases (case-insensitive): "must now make a decision", "must now make
your decision", "must now decide", "make your decision now", "make a decision now",
"cannot ask any more questions". A system message with one of them (for example the
last-round message "You cannot ask any more questions. You must now make a decision.")
restricts the candidates to the two decisions.

*Stance* of an ``Answer:`` agent (case-insensitive, first match over the system messages,
most recent first): "convince ... to accept|reject", "argue ... accept|reject",
"stance ... accept|reject" (within one sentence). Without a stance, arguments for both
sides are candidates.

*Code lines*: up to three lines of the first fenced code block (```` ``` ````) of the
prompt are quoted by some question and answer candidates.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from nipflow_llm_server.policy.tokenizer import message_text

KIND_DECISION = "decision"
KIND_QUESTION = "question"
KIND_ANSWER = "answer"
KIND_GENERIC = "generic"
ALL_KINDS = frozenset({KIND_DECISION, KIND_QUESTION, KIND_ANSWER, KIND_GENERIC})

DECISION_ACCEPT = "Decision: accept"
DECISION_REJECT = "Decision: reject"

_HEADER_RE = re.compile(r"Question for [A-Za-z0-9_]+:")
_MUST_DECIDE_RE = re.compile(
    r"must now (?:make (?:a|your) decision|decide)|make (?:a|your) decision now"
    r"|cannot ask any more questions",
    re.IGNORECASE,
)
_STANCE_RES = (
    re.compile(r"convinc\w*\b[^.\n]{0,120}?\bto (accept|reject)\b", re.IGNORECASE),
    re.compile(r"\bargue\w*\b[^.\n]{0,80}?\b(accept|reject)", re.IGNORECASE),
    re.compile(r"\bstance\b[^.\n]{0,40}?\b(accept|reject)", re.IGNORECASE),
)
_FENCE_RE = re.compile(r"```[A-Za-z0-9_+-]*\n(.*?)```", re.DOTALL)
_SYSTEM_ROLES = ("system", "developer")
MAX_CODE_LINES = 3


@dataclass(frozen=True)
class ResponseFormat:
    """The response kinds a prompt asks for, with what the candidates need from it."""

    decision: bool = False
    question_headers: tuple[str, ...] = ()
    answer: bool = False
    must_decide: bool = False
    stance: str | None = None
    code_lines: tuple[str, ...] = ()

    @property
    def marked(self) -> bool:
        """Whether any format marker was found."""
        return self.decision or bool(self.question_headers) or self.answer or self.must_decide

    @property
    def kinds(self) -> frozenset[str]:
        """Kinds of response allowed (unmarked prompts allow every kind)."""
        if self.must_decide:
            return frozenset({KIND_DECISION})
        if not self.marked:
            return ALL_KINDS
        kinds = set()
        if self.decision:
            kinds.add(KIND_DECISION)
        if self.question_headers:
            kinds.add(KIND_QUESTION)
        if self.answer:
            kinds.add(KIND_ANSWER)
        return frozenset(kinds)


def classify_response(text: str) -> str:
    """Kind of a response text (used for responses learned from training data)."""
    stripped = text.strip()
    if stripped.lower().startswith("decision:"):
        return KIND_DECISION
    if _HEADER_RE.match(stripped):
        return KIND_QUESTION
    if stripped.startswith("Answer:"):
        return KIND_ANSWER
    return KIND_GENERIC


def _has_marker(text: str) -> bool:
    return (
        DECISION_ACCEPT in text
        or DECISION_REJECT in text
        or "Answer:" in text
        or _HEADER_RE.search(text) is not None
        or _MUST_DECIDE_RE.search(text) is not None
    )


def _find_stance(system_texts: Sequence[str]) -> str | None:
    for text in reversed(system_texts):
        for pattern in _STANCE_RES:
            match = pattern.search(text)
            if match:
                return match.group(1).lower()
    return None


def _code_lines(texts: Sequence[str]) -> tuple[str, ...]:
    for text in texts:
        match = _FENCE_RE.search(text)
        if match is None:
            continue
        lines = []
        for raw in match.group(1).splitlines():
            line = raw.strip()
            if len(line) < 6 or line.startswith("#") or not any(ch.isalnum() for ch in line):
                continue
            if line not in lines:
                lines.append(line)
        # a fixed pseudo-random choice, so that the same code always gives the same quotes
        ranked = sorted(lines, key=lambda s: zlib.crc32(s.encode("utf-8")))[:MAX_CODE_LINES]
        return tuple(line for line in lines if line in ranked)
    return ()


@lru_cache(maxsize=4096)
def _format_from_texts(system_texts: tuple[str, ...], other_texts: tuple[str, ...]) -> ResponseFormat:
    chosen = None
    for text in reversed(system_texts):
        if _has_marker(text):
            chosen = text
            break
    if chosen is None and system_texts:
        chosen = system_texts[0]
    code = _code_lines(system_texts + other_texts)
    if chosen is None:
        return ResponseFormat(code_lines=code)
    headers: list[str] = []
    for header in _HEADER_RE.findall(chosen):
        if header not in headers:
            headers.append(header)
    return ResponseFormat(
        decision=DECISION_ACCEPT in chosen or DECISION_REJECT in chosen,
        question_headers=tuple(headers),
        answer="Answer:" in chosen,
        must_decide=_MUST_DECIDE_RE.search(chosen) is not None,
        stance=_find_stance(system_texts),
        code_lines=code,
    )


def detect_format(messages: Sequence[Mapping[str, Any]]) -> ResponseFormat:
    """The response format asked for by a conversation (see the module docstring)."""
    system_texts = tuple(message_text(m) for m in messages if m.get("role") in _SYSTEM_ROLES)
    other_texts = tuple(message_text(m) for m in messages if m.get("role") not in _SYSTEM_ROLES)
    return _format_from_texts(system_texts, other_texts)

"""Structured output: replies held to a JSON schema, a regular expression or a list of choices.

The request forms are OpenAI's ``response_format`` (``{"type": "json_schema", "json_schema":
{"name": ..., "schema": {...}}}`` and ``{"type": "json_object"}``) and the two vLLM request
fields ``guided_regex`` and ``guided_choice``. The transformers engine enforces them while it
samples, with **llguidance** (Microsoft's Rust constrained-decoding library, the one vLLM
also offers as a structured-output backend): before each token, the tokens that cannot
continue a text of the required form get probability zero, so the reply has the form
whatever the model would have written (a reply cut by ``max_tokens`` can stop early, as with
OpenAI). llguidance was chosen over xgrammar and outlines because its wheel has no
dependencies (xgrammar pulls triton; outlines a stack of its own), it computes a mask in
tens of microseconds on a CPU, and it reads Hugging Face tokenizers directly.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass
from typing import Any, Literal

from nipflow_llm_server.engines.base import ConstraintError

Kind = Literal["json_schema", "json_object", "regex", "choice"]

#: one space after ``,`` and ``:``, no newlines: replies stay short and parse as JSON
_JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class OutputConstraint:
    """What a reply must look like. ``value``: the schema (a dict), nothing, the regular
    expression or the choices, by ``kind``; ``param``: the request field it came from."""

    kind: Kind
    value: Any
    param: str

    def grammar(self) -> str:
        """The llguidance grammar of this constraint (checked: :class:`ConstraintError` if invalid)."""
        import llguidance

        if self.kind in ("json_schema", "json_object"):
            schema = self.value if self.kind == "json_schema" else {"type": "object"}
            grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=_JSON_LAYOUT)
        elif self.kind == "regex":
            grammar = llguidance.LLMatcher.grammar_from_regex(self.value)
        else:
            grammar = llguidance.LLMatcher.grammar_from_regex("|".join(re.escape(c) for c in self.value))
        problem = llguidance.LLMatcher.validate_grammar(grammar)
        if problem:
            raise ConstraintError(f"{self.param}: {' '.join(problem.split())}", self.param)
        return grammar


def parse_constraint(response_format: Any, guided_regex: Any = None, guided_choice: Any = None) -> OutputConstraint | None:
    """The constraint of a chat request's fields, or ``None`` (``{"type": "text"}`` or nothing).

    Raises
    ------
    ConstraintError
        A malformed field, or more than one constraint in one request.
    """
    found: list[OutputConstraint] = []
    if response_format is not None:
        if not isinstance(response_format, dict) or response_format.get("type") not in ("text", "json_object", "json_schema"):
            raise ConstraintError("response_format.type: must be 'text', 'json_object' or 'json_schema'",
                                  "response_format")
        kind = response_format["type"]
        if kind == "json_object":
            found.append(OutputConstraint("json_object", None, "response_format"))
        elif kind == "json_schema":
            spec = response_format.get("json_schema")
            schema = spec.get("schema") if isinstance(spec, dict) else None
            if not isinstance(schema, dict):
                raise ConstraintError("response_format.json_schema.schema: a JSON schema object is required",
                                      "response_format")
            found.append(OutputConstraint("json_schema", schema, "response_format"))
    if guided_regex is not None:
        if not isinstance(guided_regex, str) or not guided_regex:
            raise ConstraintError("guided_regex: must be a non-empty regular expression", "guided_regex")
        found.append(OutputConstraint("regex", guided_regex, "guided_regex"))
    if guided_choice is not None:
        if not (isinstance(guided_choice, list) and guided_choice
                and all(isinstance(c, str) and c for c in guided_choice)):
            raise ConstraintError("guided_choice: must be a non-empty list of non-empty strings", "guided_choice")
        found.append(OutputConstraint("choice", tuple(guided_choice), "guided_choice"))
    if len(found) > 1:
        raise ConstraintError(f"{', '.join(c.param for c in found)}: give one output constraint per request",
                              found[1].param)
    return found[0] if found else None


class Matchers:
    """llguidance matchers for one engine: the tokenizer's llguidance view is built once per
    tokenizer (about 0.4 s for a 49k vocabulary), the grammar once per constraint."""

    def __init__(self):
        self._tokenizers: dict[int, Any] = {}
        self._grammars: dict[str, str] = {}
        self._lock = threading.Lock()

    def new(self, constraint: OutputConstraint, tokenizer: Any, n_vocab: int) -> Any:
        """A fresh matcher (one per generated sequence) for ``constraint`` over ``tokenizer``."""
        import llguidance
        import llguidance.hf

        key = json.dumps([constraint.kind, constraint.value], sort_keys=True, default=list)
        with self._lock:
            if key not in self._grammars:
                self._grammars[key] = constraint.grammar()
            if id(tokenizer) not in self._tokenizers:
                self._tokenizers[id(tokenizer)] = (tokenizer, llguidance.hf.from_tokenizer(tokenizer, n_vocab=n_vocab))
            ll_tokenizer = self._tokenizers[id(tokenizer)][1]
        matcher = llguidance.LLMatcher(ll_tokenizer, self._grammars[key], log_level=1)
        if matcher.is_error():
            raise ConstraintError(f"{constraint.param}: {matcher.get_error()}", constraint.param)
        return matcher


def mask_logits(logits: Any, matcher: Any) -> Any:
    """A copy of one row's float32 CPU logits with every token the matcher forbids at ``-inf``."""
    import llguidance.torch as lt

    masked = logits.clone()[None]
    bitmask = lt.allocate_token_bitmask(1, masked.shape[-1])
    lt.fill_next_token_bitmask(matcher, bitmask, 0)
    lt.apply_token_bitmask_inplace(masked, bitmask)
    return masked[0]

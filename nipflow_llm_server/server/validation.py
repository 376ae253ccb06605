"""Line-by-line validation of fine-tuning JSONL files.

Two formats are accepted (one per file):

* **chat** (supervised): ``{"messages": [{"role", "content", ["name"], ["weight"]}, ...]}``
  with at least one ``assistant`` message; ``weight`` (0 or 1) only on assistant
  messages.
* **preference** (DPO, OpenAI's format): ``{"input": {"messages": [...]},
  "preferred_output": [{"role": "assistant", "content": ...}],
  "non_preferred_output": [{"role": "assistant", "content": ...}]}``. ``input`` may also
  be a bare list of messages (the form the original nip library wrote).

Upload checks the format of every line; a job additionally checks that the format
matches its method and that there are at least ``MIN_EXAMPLES`` examples. Every error
names the 1-based line number.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
MIN_EXAMPLES = 10
FORMAT_CHAT = "chat"
FORMAT_PREFERENCE = "preference"
METHOD_FORMATS = {"supervised": FORMAT_CHAT, "dpo": FORMAT_PREFERENCE}


class TrainingFileError(ValueError):
    """A training file that cannot be used; ``code`` is OpenAI's error code."""

    def __init__(self, message: str, line: int | None = None, code: str = "invalid_training_file"):
        self.line = line
        self.code = code
        super().__init__(f"line {line}: {message}" if line is not None else message)


@dataclass(frozen=True)
class TrainingFile:
    """A parsed, valid training file."""

    format: str
    examples: list[dict[str, Any]]


def _check_content(message: Mapping[str, Any], where: str) -> None:
    content = message.get("content")
    if isinstance(content, str):
        return
    if content is None and message.get("role") == "assistant" and message.get("tool_calls"):
        return
    if isinstance(content, list) and all(
        isinstance(p, Mapping) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content
    ):
        return
    raise ValueError(f"{where}: 'content' must be a string or a list of text parts")


def _check_messages(messages: Any, where: str) -> None:
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{where} must be a non-empty list of messages")
    for i, message in enumerate(messages):
        at = f"{where}[{i}]"
        if not isinstance(message, Mapping):
            raise ValueError(f"{at} must be an object")
        role = message.get("role")
        if role not in ROLES:
            raise ValueError(f"{at}: invalid role {role!r}")
        _check_content(message, at)
        if "name" in message and not isinstance(message["name"], str):
            raise ValueError(f"{at}: 'name' must be a string")
        if "weight" in message:
            if role != "assistant":
                raise ValueError(f"{at}: 'weight' is only allowed on assistant messages")
            if message["weight"] not in (0, 1):
                raise ValueError(f"{at}: 'weight' must be 0 or 1")


def _check_outputs(outputs: Any, where: str) -> None:
    if not isinstance(outputs, list) or len(outputs) != 1:
        raise ValueError(f"'{where}' must be a list of exactly one assistant message")
    _check_messages(outputs, where)
    if outputs[0].get("role") != "assistant" or not isinstance(outputs[0].get("content"), str):
        raise ValueError(f"'{where}' must hold an assistant message with string content")


def check_example(example: Any) -> str:
    """Format of one example; raises ``ValueError`` describing what is wrong."""
    if not isinstance(example, Mapping):
        raise ValueError("each line must be a JSON object")
    if "messages" in example:
        _check_messages(example["messages"], "messages")
        if not any(m.get("role") == "assistant" for m in example["messages"]):
            raise ValueError("'messages' must contain at least one assistant message")
        return FORMAT_CHAT
    if "input" in example:
        inp = example["input"]
        messages = inp.get("messages") if isinstance(inp, Mapping) else inp
        _check_messages(messages, "input.messages")
        _check_outputs(example.get("preferred_output"), "preferred_output")
        _check_outputs(example.get("non_preferred_output"), "non_preferred_output")
        return FORMAT_PREFERENCE
    raise ValueError("expected a chat example with 'messages' or a preference example with 'input', 'preferred_output' and 'non_preferred_output'")


def parse_training_file(content: bytes) -> TrainingFile:
    """Parse and check a JSONL training file; raises :class:`TrainingFileError`."""
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TrainingFileError(f"file is not valid UTF-8 ({exc.reason})", code="invalid_file_format") from None
    examples: list[dict[str, Any]] = []
    fmt = None
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            example = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TrainingFileError(f"invalid JSON ({exc.msg} at column {exc.colno})", number) from None
        try:
            line_fmt = check_example(example)
        except ValueError as exc:
            raise TrainingFileError(str(exc), number) from None
        if fmt is None:
            fmt = line_fmt
        elif line_fmt != fmt:
            raise TrainingFileError(f"{line_fmt} example in a file of {fmt} examples", number)
        examples.append(example)
    if fmt is None:
        raise TrainingFileError("the file contains no examples")
    return TrainingFile(format=fmt, examples=examples)


def training_examples(content: bytes, method: str, *, role: str = "training") -> list[dict[str, Any]]:
    """Examples of a file checked for a job of ``method`` (``supervised`` or ``dpo``)."""
    parsed = parse_training_file(content)
    wanted = METHOD_FORMATS[method]
    if parsed.format != wanted:
        raise TrainingFileError(
            f"a {method} job needs {wanted} examples but the {role} file holds {parsed.format} examples", 1
        )
    if role == "training" and len(parsed.examples) < MIN_EXAMPLES:
        raise TrainingFileError(
            f"Training file has {len(parsed.examples)} example(s), but must have at least {MIN_EXAMPLES} examples",
            code="invalid_n_examples",
        )
    return parsed.examples

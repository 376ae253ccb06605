"""Dotted overrides (``--set rl.num_iterations=50``) applied to a parameter dict."""

from __future__ import annotations

import copy
import json
from typing import Any, Iterable

from nip_core.parameters.base import ParameterError


def parse_override(text: str) -> tuple[list[str], Any]:
    """Split ``"a.b.c=value"`` into a key path and a value.

    The value is parsed as JSON when it is valid JSON (numbers, booleans, ``null``,
    lists, objects, quoted strings); otherwise it is taken as a plain string.
    """
    if "=" not in text:
        raise ParameterError([(text, "override must look like key.path=value")])
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ParameterError([(key or "<empty>", "empty component in override key")])
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return key.split("."), value


def apply_overrides(data: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Return a copy of ``data`` with each dotted override set (creating nested dicts)."""
    result = copy.deepcopy(data)
    for text in overrides:
        path, value = parse_override(text)
        node = result
        for i, part in enumerate(path[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                dotted = ".".join(path[: i + 1])
                raise ParameterError([(dotted, "is not a parameter group; cannot set a field inside it")])
            node = child
        node[path[-1]] = value
    return result

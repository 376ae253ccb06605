"""A readable listing of a parameter tree: one ``path: type = value  # description`` per field.

``nipflow params show --describe`` prints it; the descriptions are the fields' own
(``Field(description=...)``), so the listing, the JSON schema and the Prefect forms agree.
"""

from __future__ import annotations

import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel

__all__ = ["describe_lines", "type_name"]


def type_name(annotation: Any) -> str:
    """A short, Python-like spelling of a field's type (``int | None``, ``'clip' | 'kl_penalty'``)."""
    if annotation is None or annotation is type(None):
        return "None"
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin is Annotated:
        return type_name(args[0])
    if origin is Literal:
        return " | ".join(repr(a) for a in args)
    if origin is Union or origin is types.UnionType:
        return " | ".join(type_name(a) for a in args)
    if origin is not None:
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(type_name(a) for a in args)}]"
    return getattr(annotation, "__name__", str(annotation))


def _value_text(value: Any) -> str:
    if isinstance(value, BaseModel):
        return repr(value.model_dump())
    return repr(value)


def describe_lines(model: BaseModel, prefix: str = "") -> list[str]:
    """One line per leaf field of ``model`` (nested groups and mapping entries expanded).

    Parameters
    ----------
    model
        A parameter tree, e.g. a ``HyperParameters`` with its defaults filled in.
    prefix
        Dotted path of ``model`` in the whole tree (``"rl."``).

    Returns
    -------
    list[str]
        ``dotted.path: type = value  # description``; a mapping of groups (``agents``)
        lists each entry under its key (``agents._default.d_gnn``).
    """
    lines: list[str] = []
    for name, info in type(model).model_fields.items():
        value = getattr(model, name)
        path = f"{prefix}{name}"
        if isinstance(value, BaseModel) and type(value).model_fields:
            lines.extend(describe_lines(value, f"{path}."))
            continue
        if isinstance(value, dict) and value and all(isinstance(v, BaseModel) for v in value.values()):
            for key, entry in value.items():
                lines.extend(describe_lines(entry, f"{path}.{key}."))
            continue
        line = f"{path}: {type_name(info.annotation)} = {_value_text(value)}"
        if info.description:
            line += f"  # {info.description}"
        lines.append(line)
    return lines

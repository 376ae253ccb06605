"""Base model and error formatting for all parameter groups.

Every parameter group is a pydantic v2 model that forbids unknown keys and validates
assignments, so a typo in a JSON file or a ``--set`` override is an error that names
the dotted field path rather than a silently ignored value.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError


class ParamsModel(BaseModel):
    """Base class of every parameter group (``SubParameters`` in the original library)."""

    model_config = ConfigDict(
        extra="forbid",
        validate_assignment=True,
        validate_default=True,
        protected_namespaces=(),
    )

    def get(self, address: str) -> Any:
        """Look up a (possibly nested) value by dotted address, e.g. ``"rl.lr"``.

        Raises
        ------
        KeyError
            If any component of the address does not exist.
        """
        value: Any = self
        for part in address.split("."):
            if isinstance(value, BaseModel):
                if part not in type(value).model_fields:
                    raise KeyError(address)
                value = getattr(value, part)
            elif isinstance(value, dict):
                if part not in value:
                    raise KeyError(address)
                value = value[part]
            else:
                raise KeyError(address)
        return value


class BaseRunPreserve:
    """Marker (used in ``Annotated``) for fields kept when params are copied from a base run.

    Parameters
    ----------
    *base_run_types
        The ``base_run.base_run_type`` values for which the current value is preserved.
    """

    def __init__(self, *base_run_types: str):
        self.base_run_types = frozenset(base_run_types)

    def __repr__(self) -> str:  # pragma: no cover - cosmetic
        return f"BaseRunPreserve({', '.join(sorted(self.base_run_types))})"


class ParameterError(ValueError):
    """Invalid hyper-parameters; the message lists each offending dotted field path."""

    def __init__(self, problems: list[tuple[str, str]], source: str | None = None):
        self.problems = problems
        self.source = source
        where = f" in {source}" if source else ""
        lines = [f"{path}: {msg}" for path, msg in problems]
        super().__init__(f"invalid hyper-parameters{where}: " + "; ".join(lines))


# Discriminator tags that pydantic inserts into error locations; they are not field names.
_UNION_TAGS = {"graph_isomorphism", "code_validation", "random", "constant",
               "contiguous_periodic", "alternating_periodic"}


def dotted_path(loc: tuple[Any, ...]) -> str:
    """Turn a pydantic error location into the user's dotted field path."""
    parts: list[str] = []
    for i, item in enumerate(loc):
        if isinstance(item, str) and item in _UNION_TAGS and i > 0:
            continue
        if isinstance(item, str) and (item.startswith("function-") or "[" in item):
            continue
        parts.append(str(item))
    return ".".join(parts) if parts else "<root>"


def problems_from_validation_error(error: ValidationError) -> list[tuple[str, str]]:
    """Extract ``(dotted_path, message)`` pairs from a pydantic error, deduplicated."""
    seen: dict[str, str] = {}
    for err in error.errors(include_url=False):
        path = dotted_path(tuple(err["loc"]))
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown parameter"
        seen.setdefault(path, msg)
    return list(seen.items())

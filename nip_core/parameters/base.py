"""Base model and error formatting for all parameter groups.

Every parameter group is a pydantic v2 model that forbids unknown keys and validates
assignments, so a typo in a JSON file or a ``--set`` override is an error that names
the dotted field path rather than a silently ignored value.

Fields of the original library that nipflow does not implement are declared with
:func:`unsupported_field`: they stay in the model with their default (so that the original
library's parameter files, which list every field, still load), their description says
"Not supported by nipflow" and why, and any other value is refused by the one validator
of :class:`ParamsModel` with an error that names the field (docs/behaviour.md#b41).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError

#: ``json_schema_extra`` key that marks a field as not supported; its value is the reason.
UNSUPPORTED_KEY = "nipflow_unsupported"


def unsupported_field(default: Any, meaning: str, reason: str, **constraints: Any) -> Any:
    """Declare a field of the original library that nipflow accepts only at its default.

    Parameters
    ----------
    default
        The original library's default; the only value accepted.
    meaning
        What the field did in the original library (one sentence).
    reason
        Why nipflow refuses it and what to use instead (one short sentence); it ends the
        field's description and the error a non-default value raises.
    **constraints
        Further ``Field`` arguments (``gt``, ``ge``...), so that the type stays as it was.

    Returns
    -------
    FieldInfo
        The field, with description ``"<meaning> Not supported by nipflow: <reason>"`` and
        the reason under :data:`UNSUPPORTED_KEY` in its JSON schema.
    """
    return Field(default, description=f"{meaning} Not supported by nipflow: {reason}",
                 json_schema_extra={UNSUPPORTED_KEY: reason}, **constraints)


def unsupported_reason(info: FieldInfo) -> str | None:
    """The reason a field declared with :func:`unsupported_field` is refused, else ``None``."""
    extra = info.json_schema_extra
    return extra.get(UNSUPPORTED_KEY) if isinstance(extra, dict) else None


# model class -> {field name: reason} of its unsupported fields (filled on first validation)
_UNSUPPORTED: dict[type, dict[str, str]] = {}


def unsupported_fields(model: type[BaseModel]) -> dict[str, str]:
    """``{field name: reason}`` of the fields of ``model`` declared with :func:`unsupported_field`."""
    found = _UNSUPPORTED.get(model)
    if found is None:
        found = {name: reason for name, info in model.model_fields.items()
                 if (reason := unsupported_reason(info)) is not None}
        _UNSUPPORTED[model] = found
    return found


class ParamsModel(BaseModel):
    """Base class of every parameter group (``SubParameters`` in the original library)."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,  # built once and shared (HyperParameters.from_dict): never changed in place
        validate_default=True,
        protected_namespaces=(),
    )

    @field_validator("*", mode="after")
    @classmethod
    def _refuse_unsupported(cls, value: Any, info: ValidationInfo) -> Any:
        """Refuse a non-default value of a field declared with :func:`unsupported_field`."""
        reason = unsupported_fields(cls).get(info.field_name)
        if reason is not None:
            default = cls.model_fields[info.field_name].default
            if value != default:
                message = (f"{info.field_name}={value!r} is not supported by nipflow (only the default "
                           f"{default!r} is accepted): {reason}")
                raise PydanticCustomError("unsupported_parameter", "{message}", {"message": message})
        return value

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
_UNION_TAGS = {"graph_isomorphism", "code_validation", "random", "oracle_prover", "constant",
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


class FieldProblems(ValueError):
    """Raised by a model validator that found problems at several dotted paths at once."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        super().__init__("; ".join(f"{path}: {msg}" for path, msg in problems))


def problems_from_validation_error(error: ValidationError) -> list[tuple[str, str]]:
    """Extract ``(dotted_path, message)`` pairs from a pydantic error, deduplicated."""
    seen: dict[str, str] = {}
    for err in error.errors(include_url=False):
        raised = (err.get("ctx") or {}).get("error")
        if isinstance(raised, FieldProblems):  # a model validator's findings, each with its own path
            for path, msg in raised.problems:
                seen.setdefault(path, msg)
            continue
        path = dotted_path(tuple(err["loc"]))
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown parameter"
        seen.setdefault(path, msg)
    return list(seen.items())

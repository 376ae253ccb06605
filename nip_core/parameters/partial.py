"""Partial parameter models: every field of a parameter group optional, nothing else changed.

:func:`partial_model` derives, from a parameter model such as ``HyperParameters``, a model
with the same fields, types (``Literal``\\ s, constraints, nested groups, each nested group
made partial in turn) and descriptions, in which every field defaults to ``None``. It is
generated from the models themselves, so it cannot drift from them. The flows use it for
the ``params`` form of ``train_experiment``: a user fills in only the fields to change.

A partial model remembers which fields were given: it serialises those only (also in
nested groups), so that ``model_dump(mode="json")`` is exactly the subset of the tree the
user gave, ready to be merged with the other inputs and validated into the full model.
A field given as ``null`` that the full model does not accept as ``None`` (a form sending
empty fields as ``null``) counts as not given.
"""

from __future__ import annotations

import types
from typing import Annotated, Any, ClassVar, Literal, Optional, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, create_model, model_serializer, model_validator
from pydantic.fields import FieldInfo

__all__ = ["PartialParams", "partial_model"]

_CACHE: dict[type[BaseModel], type["PartialParams"]] = {}


class PartialParams(BaseModel):
    """Base class of the generated partial models (see :func:`partial_model`)."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    #: the full model this one mirrors
    full_model: ClassVar[type[BaseModel]]
    #: fields whose full type does not accept ``None``: a ``null`` there means "not given"
    not_nullable: ClassVar[frozenset[str]] = frozenset()

    @model_validator(mode="before")
    @classmethod
    def _null_means_unset(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if not (v is None and k in cls.not_nullable)}
        return data

    @model_serializer(mode="wrap")
    def _given_fields_only(self, handler) -> dict[str, Any]:
        dumped = handler(self)
        return {k: v for k, v in dumped.items() if k in self.model_fields_set}


def accepts_none(annotation: Any) -> bool:
    """Whether a field annotated ``annotation`` accepts ``None``."""
    if annotation is None or annotation is type(None) or annotation is Any:
        return True
    origin = get_origin(annotation)
    if origin is Annotated:
        return accepts_none(get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        return any(accepts_none(a) for a in get_args(annotation))
    if origin is Literal:
        return None in get_args(annotation)
    return False


def _partial_metadata(item: Any) -> Any:
    """Annotated metadata as kept in a partial type: a discriminator cannot stay (the
    tag field is optional in the partial members), everything else does."""
    if isinstance(item, FieldInfo) and item.discriminator is not None:
        kept = FieldInfo.merge_field_infos(item)
        kept.discriminator = None
        return kept
    return item


def partial_type(annotation: Any) -> Any:
    """``annotation`` with every parameter model in it replaced by its partial model."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return partial_model(annotation)
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin is Annotated:
        inner, *metadata = args
        return Annotated[(partial_type(inner), *(_partial_metadata(m) for m in metadata))]
    if origin is Union or origin is types.UnionType:
        return Union[tuple(partial_type(a) for a in args)]
    if origin in (list, dict, tuple, set, frozenset) and args:
        return origin[tuple(partial_type(a) for a in args)] if len(args) > 1 else origin[partial_type(args[0])]
    return annotation


def partial_model(model: type[BaseModel]) -> type[PartialParams]:
    """The partial model of ``model`` (built once, then cached).

    Parameters
    ----------
    model
        A pydantic model (a parameter group such as ``HyperParameters``).

    Returns
    -------
    type[PartialParams]
        ``<Name>Partial``: the fields of ``model``, each ``Optional`` with default ``None``,
        with the same types (nested models partial too), constraints, validators of the
        field types and descriptions; none of ``model``'s model validators (they check
        a complete group).
    """
    if model in _CACHE:
        return _CACHE[model]
    fields: dict[str, Any] = {}
    not_nullable = set()
    for name, info in model.model_fields.items():
        inner = partial_type(info.annotation)
        metadata = [_partial_metadata(m) for m in info.metadata]
        if info.json_schema_extra is not None:
            metadata.append(Field(json_schema_extra=info.json_schema_extra))
        annotation = Annotated[(inner, *metadata)] if metadata else inner
        fields[name] = (Optional[annotation], Field(None, description=info.description, title=info.title))
        if not accepts_none(info.annotation):
            not_nullable.add(name)
    partial = create_model(f"{model.__name__}Partial", __base__=PartialParams, __module__=__name__,
                           __doc__=model.__doc__ or f"Any fields of ``{model.__name__}``.", **fields)
    partial.full_model = model
    partial.not_nullable = frozenset(not_nullable)
    _CACHE[model] = partial
    return partial

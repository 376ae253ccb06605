"""Trainer registry: ``@register_trainer("vanilla_ppo")`` is the one place a trainer is declared.

A trainer class states what it is as class attributes, checked when it is registered:
``trainer_kind`` (``"tensordict"``, ``"pure_text"`` or ``"solo"``), ``needs_critic`` and,
optionally, ``critic_switch`` (see :mod:`nip_core.parameters.trainer_specs`). The base
classes set them — ``TensorDictTrainer`` (from nip's ``trainer_type``) and
``PureTextRlTrainer`` — so a subclass needs only the decorator, as in nip's guide.

The class is kept here (:data:`TRAINER_REGISTRY`, :func:`get_trainer_class`); what it
declared is recorded in :mod:`nip_core.parameters.trainer_specs`, below the parameters,
which is where every question about a trainer *name* is answered (the names
``HyperParameters`` accepts, which trainers are pure-text, which get value heads) without
importing a trainer. Built-in trainers are registered by importing
:mod:`nip_core.trainers.catalogue`, which :func:`get_trainer_class` does when a trainer is
built; a user's trainer is registered by importing the module that defines it.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

from nip_core.parameters.trainer_specs import (TRAINER_KINDS, TrainerSpec, UnknownTrainerError, declare, declared,
                                               forget)

T = TypeVar("T", bound=type)

#: name -> trainer class (tests may swap in a stand-in class under a registered name)
TRAINER_REGISTRY: dict[str, type] = {}


class TrainerRegistrationError(TypeError):
    """A trainer class that does not declare what the registry needs (names the class)."""


def _resolve_switch(cls: type, switch: Any) -> str | None:
    """Check ``critic_switch``: ``None`` or the dotted path of a bool hyper-parameter.

    The path is looked up in the class's ``hyper_params_model`` (``HyperParameters`` for
    every subclass of :class:`~nip_core.trainers.base.Trainer`).
    """
    if switch is None:
        return None
    where = f"{cls.__module__}.{cls.__qualname__}"
    if not isinstance(switch, str) or not switch:
        raise TrainerRegistrationError(f"{where}.critic_switch must be None or a dotted parameter path, "
                                       f"got {switch!r}")
    model: Any = getattr(cls, "hyper_params_model", None)
    if getattr(model, "model_fields", None) is None:
        raise TrainerRegistrationError(f"{where}.critic_switch: the class has no hyper_params_model (a "
                                       f"pydantic model) to look {switch!r} up in; subclass Trainer")
    parts = switch.split(".")
    for i, part in enumerate(parts):
        fields = getattr(model, "model_fields", None)
        if fields is None or part not in fields:
            raise TrainerRegistrationError(f"{where}.critic_switch: {switch!r} is not a hyper-parameter")
        annotation = fields[part].annotation
        if i == len(parts) - 1:
            if annotation is not bool:
                raise TrainerRegistrationError(f"{where}.critic_switch: {switch!r} is not a boolean parameter")
        else:
            model = annotation
    return switch


def _spec_of(cls: type, name: str) -> TrainerSpec:
    where = f"{cls.__module__}.{cls.__qualname__}"
    kind = getattr(cls, "trainer_kind", None)
    if kind not in TRAINER_KINDS:
        raise TrainerRegistrationError(
            f"trainer class {where} (registered as {name!r}) must declare trainer_kind as a class "
            f"attribute, one of {', '.join(TRAINER_KINDS)}; got {kind!r}")
    needs_critic = getattr(cls, "needs_critic", None)
    if not isinstance(needs_critic, bool):
        raise TrainerRegistrationError(
            f"trainer class {where} (registered as {name!r}) must declare needs_critic: bool as a class "
            f"attribute; got {needs_critic!r}")
    switch = _resolve_switch(cls, getattr(cls, "critic_switch", None))
    if needs_critic and switch is not None:
        raise TrainerRegistrationError(f"trainer class {where}: critic_switch is only for trainers without "
                                       "needs_critic")
    return TrainerSpec(name=name, kind=kind, needs_critic=needs_critic, critic_switch=switch,
                       class_name=where)


def register_trainer(name: str) -> Callable[[T], T]:
    """Class decorator registering a trainer under ``name`` (a value of ``HyperParameters.trainer``).

    Parameters
    ----------
    name
        The trainer's name in the hyper-parameters; at most one class per name.

    Raises
    ------
    TrainerRegistrationError
        If the class does not declare a valid ``trainer_kind`` and ``needs_critic`` (or has
        an invalid ``critic_switch``); the message names the class.
    ValueError
        If ``name`` is not an identifier or another class holds it already.
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"trainer name must be an identifier, got {name!r}")

    def decorator(cls: T) -> T:
        previous = declared(name)
        if previous is not None and TRAINER_REGISTRY.get(name) is not cls:
            raise ValueError(f"trainer '{name}' is already registered by {previous.class_name}")
        spec = _spec_of(cls, name)
        TRAINER_REGISTRY[name] = cls
        declare(spec)
        cls.trainer_name = name
        return cls

    return decorator


def unregister_trainer(name: str) -> None:
    """Remove ``name`` from the registry (a trainer registered by a test or a plug-in)."""
    TRAINER_REGISTRY.pop(name, None)
    forget(name)


def _load_built_ins() -> None:
    import nip_core.trainers.catalogue  # noqa: F401  (registers the built-in trainers)


def get_trainer_class(name: str) -> type:
    _load_built_ins()
    try:
        return TRAINER_REGISTRY[name]
    except KeyError:
        raise UnknownTrainerError(name) from None

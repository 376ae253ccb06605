"""Trainer registry: ``@register_trainer("vanilla_ppo")`` is the one place a trainer is declared.

A trainer class states what it is as class attributes, checked when it is registered:

``trainer_kind``
    ``"tensordict"`` (TorchRL agents on a TensorDict scenario), ``"pure_text"`` (text
    agents behind an OpenAI-shaped API; the ``code_validation`` scenario) or ``"solo"``
    (supervised training of each agent alone).
``needs_critic``
    Whether the scenario builds value heads for it (actor-critic trainers).
``critic_switch`` (optional)
    For a trainer without ``needs_critic`` that can still use a critic: the dotted path of
    the boolean hyper-parameter that turns the critic on
    (``"reinforce.use_advantage_and_critic"``).

Everything else derives from the registry: the trainer names ``HyperParameters`` accepts
(:func:`registered_trainer_names`), which trainers are pure-text (:func:`trainer_kind`) and
which get value heads (:func:`trainer_uses_critic`). Built-in trainers are registered by
importing :mod:`nip_core.trainers.catalogue`; a user's trainer is registered by importing
the module that defines it.

This module imports nothing heavy (the parameters import it, and ``build_trainer`` lives in
:mod:`nip_core.trainers.build`): a built-in trainer that is not imported yet is answered
from :data:`~nip_core.trainers.built_ins.BUILT_IN_TRAINERS`, so validating a trainer name
imports neither torch nor any trainer; :func:`get_trainer_class` imports the catalogue.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, TypeVar

from nip_core.trainers.built_ins import BUILT_IN_TRAINERS

T = TypeVar("T", bound=type)

TRAINER_KINDS = ("tensordict", "pure_text", "solo")

#: name -> trainer class (tests may swap in a stand-in class under a registered name)
TRAINER_REGISTRY: dict[str, type] = {}


@dataclass(frozen=True)
class TrainerSpec:
    """What a registered trainer declared: its name, kind and critic use."""

    name: str
    kind: str
    needs_critic: bool
    critic_switch: str | None
    class_name: str


# name -> what the class registered under that name declared (kept apart from the class so
# that a test stand-in swapped into ``TRAINER_REGISTRY`` keeps the name's declared kind)
_SPECS: dict[str, TrainerSpec] = {}


class UnknownTrainerError(KeyError):
    """A trainer name nobody registered; the message lists the registered ones."""

    def __init__(self, name: str):
        self.name = name
        super().__init__(unknown_trainer_message(name))

    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0]


class TrainerRegistrationError(TypeError):
    """A trainer class that does not declare what the registry needs (names the class)."""


def unknown_trainer_message(name: Any) -> str:
    return f"unknown trainer {name!r} (registered: {', '.join(registered_trainer_names())})"


def _resolve_switch(cls: type, switch: Any) -> str | None:
    """Check ``critic_switch``: ``None`` or the dotted path of a bool hyper-parameter.

    The path is looked up in the class's ``hyper_params_model`` (``HyperParameters`` for
    every subclass of :class:`~nip_core.trainers.base.Trainer`), so that this module
    imports no parameters: the parameters import it.
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
        if name in _SPECS and TRAINER_REGISTRY.get(name) is not cls:
            raise ValueError(f"trainer '{name}' is already registered by {_SPECS[name].class_name}")
        spec = _spec_of(cls, name)
        TRAINER_REGISTRY[name] = cls
        _SPECS[name] = spec
        cls.trainer_name = name
        return cls

    return decorator


def unregister_trainer(name: str) -> None:
    """Remove ``name`` from the registry (a trainer registered by a test or a plug-in)."""
    TRAINER_REGISTRY.pop(name, None)
    _SPECS.pop(name, None)


def _load_built_ins() -> None:
    import nip_core.trainers.catalogue  # noqa: F401  (registers the built-in trainers)


def registered_trainer_names() -> list[str]:
    """Every registered trainer name, the built-ins included, sorted (nothing is imported)."""
    return sorted(set(_SPECS) | set(BUILT_IN_TRAINERS))


def trainer_spec(name: str) -> TrainerSpec:
    """What the trainer registered as ``name`` declared; raises :class:`UnknownTrainerError`.

    A built-in trainer not imported yet is answered from what the catalogue states for it.
    """
    if name in _SPECS:
        return _SPECS[name]
    if name in BUILT_IN_TRAINERS:
        built_in = BUILT_IN_TRAINERS[name]
        return TrainerSpec(name=name, kind=built_in.kind, needs_critic=built_in.needs_critic,
                           critic_switch=built_in.critic_switch, class_name=f"{built_in.module} (not imported)")
    raise UnknownTrainerError(name)


def trainer_kind(name: str) -> str:
    """``"tensordict"``, ``"pure_text"`` or ``"solo"``."""
    return trainer_spec(name).kind


def is_text_trainer(name: str) -> bool:
    return trainer_kind(name) == "pure_text"


def trainer_uses_critic(hyper_params) -> bool:
    """Whether the trainer of ``hyper_params`` trains a critic (and so needs value heads)."""
    spec = trainer_spec(hyper_params.trainer)
    if spec.needs_critic:
        return True
    if spec.critic_switch is None:
        return False
    value: Any = hyper_params
    for part in spec.critic_switch.split("."):
        value = getattr(value, part)
    return bool(value)


def get_trainer_class(name: str) -> type:
    _load_built_ins()
    try:
        return TRAINER_REGISTRY[name]
    except KeyError:
        raise UnknownTrainerError(name) from None

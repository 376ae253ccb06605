"""Trainer registry: ``@register_trainer("vanilla_ppo")`` and ``get_trainer_class``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, TypeVar

if TYPE_CHECKING:
    from nip_core.trainers.base import Trainer

T = TypeVar("T", bound="type[Trainer]")

TRAINER_REGISTRY: dict[str, type["Trainer"]] = {}


class UnknownTrainerError(KeyError):
    def __init__(self, name: str):
        super().__init__(f"no trainer registered under '{name}' (known: {sorted(TRAINER_REGISTRY)})")


def register_trainer(name: str) -> Callable[[T], T]:
    """Class decorator registering a trainer under ``name`` (a ``TrainerType`` value)."""

    def decorator(cls: T) -> T:
        if name in TRAINER_REGISTRY and TRAINER_REGISTRY[name] is not cls:
            raise ValueError(f"trainer '{name}' is already registered by {TRAINER_REGISTRY[name]!r}")
        TRAINER_REGISTRY[name] = cls
        cls.trainer_name = name
        return cls

    return decorator


def get_trainer_class(name: str) -> type["Trainer"]:
    import nip_core.trainers.catalogue  # noqa: F401  (registers the built-in trainers)

    try:
        return TRAINER_REGISTRY[name]
    except KeyError:
        raise UnknownTrainerError(name) from None

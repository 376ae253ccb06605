"""What the registered trainers declared: names, kinds and critic use, below the parameters.

The parameters ask this module whether a trainer name exists and whether it trains a text
scenario; the scenarios ask whether it uses a critic. It imports nothing of nipflow, so
validating parameters (``nipflow params validate``) never imports torch or a trainer class.
The classes themselves are registered in :mod:`nip_core.trainers.registry`
(``@register_trainer``), which records each class's declaration here with :func:`declare`.

Built-in trainers are stated in :data:`BUILT_IN_TRAINERS` (their module, kind and critic
use); the answers for one come from there until its module is imported and registers it.
``tests/nip_core/trainers/test_registry.py`` checks that each built-in module registers
exactly what is stated.

Kinds: ``"tensordict"`` (TorchRL agents on a TensorDict scenario), ``"pure_text"`` (text
agents behind an OpenAI-shaped API; the ``code_validation`` scenario) or ``"solo"``
(supervised training of each agent alone). ``critic_switch``: for a trainer without
``needs_critic`` that can still use a critic, the dotted path of the boolean
hyper-parameter that turns it on (``"reinforce.use_advantage_and_critic"``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

TRAINER_KINDS = ("tensordict", "pure_text", "solo")


class BuiltInTrainer(NamedTuple):
    module: str
    kind: str
    needs_critic: bool
    critic_switch: str | None = None


BUILT_IN_TRAINERS: dict[str, BuiltInTrainer] = {
    "solo_agent": BuiltInTrainer("nip_core.trainers.solo_agent", "solo", False),
    "vanilla_ppo": BuiltInTrainer("nip_core.trainers.vanilla_ppo", "tensordict", True),
    "reinforce": BuiltInTrainer("nip_core.trainers.reinforce", "tensordict", False,
                                "reinforce.use_advantage_and_critic"),
    "spg": BuiltInTrainer("nip_core.trainers.spg", "tensordict", True),
    "pure_text_ei": BuiltInTrainer("nip_core.trainers.pure_text_ei", "pure_text", False),
    "pure_text_malt": BuiltInTrainer("nip_core.trainers.pure_text_malt", "pure_text", False),
}


@dataclass(frozen=True)
class TrainerSpec:
    """What a registered trainer declared: its name, kind and critic use."""

    name: str
    kind: str
    needs_critic: bool
    critic_switch: str | None
    class_name: str


# name -> what the class registered under that name declared (kept apart from the class, so
# that a stand-in class swapped into the class registry keeps the name's declared kind)
_SPECS: dict[str, TrainerSpec] = {}


class UnknownTrainerError(KeyError):
    """A trainer name nobody registered; the message lists the registered ones."""

    def __init__(self, name: str):
        self.name = name
        super().__init__(unknown_trainer_message(name))

    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0]


# Bumped whenever a name's answers change (a name dropped, or declared again otherwise): the
# parameters built before then are validated again (HyperParameters.from_dict keys on it).
_GENERATION = 0


def declare(spec: TrainerSpec) -> None:
    """Record what the class registered as ``spec.name`` declared (``@register_trainer`` calls it)."""
    global _GENERATION
    before = _SPECS.get(spec.name) or BUILT_IN_TRAINERS.get(spec.name)
    if before is not None and (before.kind, before.needs_critic, before.critic_switch) != (
            spec.kind, spec.needs_critic, spec.critic_switch):
        _GENERATION += 1
    _SPECS[spec.name] = spec


def forget(name: str) -> None:
    """Drop ``name``'s declaration (a trainer unregistered by a test or a plug-in)."""
    global _GENERATION
    if _SPECS.pop(name, None) is not None:
        _GENERATION += 1


def generation() -> int:
    """A number that changes whenever what a registered name declares changes."""
    return _GENERATION


def declared(name: str) -> TrainerSpec | None:
    """The declaration a registered class made for ``name`` (``None`` if none did)."""
    return _SPECS.get(name)


def unknown_trainer_message(name: Any) -> str:
    return f"unknown trainer {name!r} (registered: {', '.join(registered_trainer_names())})"


def registered_trainer_names() -> list[str]:
    """Every registered trainer name, the built-ins included, sorted (nothing is imported)."""
    return sorted(set(_SPECS) | set(BUILT_IN_TRAINERS))


def trainer_spec(name: str) -> TrainerSpec:
    """What the trainer registered as ``name`` declared; raises :class:`UnknownTrainerError`.

    A built-in trainer not imported yet is answered from :data:`BUILT_IN_TRAINERS`.
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


def trainer_uses_critic(hyper_params: Any) -> bool:
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

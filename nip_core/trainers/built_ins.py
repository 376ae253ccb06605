"""What each built-in trainer declares (name, module, kind, critic use), without importing it.

The registry answers trainer-name questions from here until a trainer's module is imported,
so that validating parameters (``HyperParameters``, ``nipflow params validate``) needs
neither torch nor the trainers; ``tests/nip_core/trainers/test_registry.py`` checks that each
module registers exactly what is stated here. :mod:`nip_core.trainers.catalogue` imports them.
"""

from __future__ import annotations

from typing import NamedTuple


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

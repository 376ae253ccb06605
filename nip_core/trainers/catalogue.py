"""The built-in trainers: importing this module registers them.

Each module listed here registers its trainer with ``@register_trainer`` when imported
(see :mod:`nip_core.trainers.registry`); this list is all there is to change when a
built-in trainer is added. A trainer outside nipflow registers by being imported.
"""

import importlib

BUILT_IN_TRAINER_MODULES = (
    "nip_core.trainers.solo_agent",
    "nip_core.trainers.vanilla_ppo",
    "nip_core.trainers.reinforce",
    "nip_core.trainers.spg",
    "nip_core.trainers.pure_text_ei",
    "nip_core.trainers.pure_text_malt",
)

for _module in BUILT_IN_TRAINER_MODULES:
    importlib.import_module(_module)

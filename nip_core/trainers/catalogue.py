"""Imports every built-in trainer module so that their ``@register_trainer`` runs.

A module that is not present yet (a trainer still being written) is skipped.
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
    try:
        importlib.import_module(_module)
    except ModuleNotFoundError as e:  # only tolerate the trainer module itself being absent
        if e.name != _module:
            raise

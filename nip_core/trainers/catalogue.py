"""The built-in trainers: importing this module registers them.

The list is :data:`nip_core.parameters.trainer_specs.BUILT_IN_TRAINERS` (what each declares, read
by the registry without importing the trainers); this module imports each one, and so
registers it with ``@register_trainer`` (see :mod:`nip_core.trainers.registry`). The
registry imports it when a trainer is built. A trainer outside nipflow registers by being
imported.
"""

import importlib

from nip_core.parameters.trainer_specs import BUILT_IN_TRAINERS

BUILT_IN_TRAINER_MODULES = tuple(t.module for t in BUILT_IN_TRAINERS.values())

for _module in BUILT_IN_TRAINER_MODULES:
    importlib.import_module(_module)

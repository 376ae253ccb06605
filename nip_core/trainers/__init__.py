"""Trainers: registry, base classes and the built-in trainers.

The names below are imported on first use (PEP 562), so that importing
:mod:`nip_core.trainers.registry` — which the parameters do to validate a trainer name —
imports neither torch nor any trainer.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Trainer": "nip_core.trainers.base", "TrainerState": "nip_core.trainers.base",
    "set_global_seed": "nip_core.trainers.base", "build_trainer": "nip_core.trainers.build",
    "TrainerHooks": "nip_core.trainers.hooks", "IterationContext": "nip_core.trainers.progress",
    "attach_progress_bar": "nip_core.trainers.progress", "TRAINER_REGISTRY": "nip_core.trainers.registry",
    "UnknownTrainerError": "nip_core.trainers.registry", "get_trainer_class": "nip_core.trainers.registry",
    "register_trainer": "nip_core.trainers.registry",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'nip_core.trainers' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)

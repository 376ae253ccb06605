"""Trainers: registry, base classes and the built-in trainers."""

from nip_core.trainers.base import Trainer, TrainerState, set_global_seed
from nip_core.trainers.build import build_trainer
from nip_core.trainers.hooks import TrainerHooks
from nip_core.trainers.progress import IterationContext, attach_progress_bar
from nip_core.trainers.registry import (
    TRAINER_REGISTRY,
    UnknownTrainerError,
    get_trainer_class,
    register_trainer,
)

__all__ = ["IterationContext", "TRAINER_REGISTRY", "Trainer", "TrainerHooks", "TrainerState",
           "UnknownTrainerError", "attach_progress_bar", "build_trainer", "get_trainer_class",
           "register_trainer", "set_global_seed"]

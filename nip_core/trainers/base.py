"""``Trainer``: the base of every trainer (TensorDict RL, supervised, pure text).

A trainer is built from ``HyperParameters`` and ``ExperimentSettings`` and runs with
``.train()`` in-process; nothing here knows about Prefect. Its persistent ``State`` (a
pydantic model) lives in the run store and is written atomically.
"""

from __future__ import annotations

import logging
import random
from abc import ABC, abstractmethod
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from nip_core.errors import CheckpointNotFoundError
from nip_core.parameters import HyperParameters
from nip_core.runs import NullRun, Run
from nip_core.settings import ExperimentSettings
from nip_core.trainers.hooks import TrainerHooks
from nip_core.trainers.progress import IterationContext, progress_enabled, total_iterations

log = logging.getLogger(__name__)


def set_global_seed(seed: int) -> None:
    """Seed python ``random``, numpy's legacy global RNG and torch."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class TrainerState(BaseModel):
    """Persistent state common to all trainers (``Trainer.State``)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    iteration: int = Field(0, ge=0)
    agents: dict[str, Any] = Field(default_factory=dict)


class Trainer(ABC):
    """Base class of every trainer.

    Parameters
    ----------
    hyper_params
        The experiment's parameters.
    settings
        Run-time options (device, run store, logging...).
    run
        The opened run in the run store; ``None`` for a throw-away run (tests, benchmarks),
        in which case nothing is persisted. Without a run, or with ``settings.test_run``,
        ``self.run`` is a :class:`~nip_core.runs.NullRun` (writes dropped, nothing stored).
    hooks
        Observer callbacks (progress, iteration end, stage end).
    stat_logger
        Where per-iteration metrics go; defaults to the run's ``metrics.jsonl`` (and W&B
        when enabled), see :func:`nip_core.logging.build_stat_logger`.
    """

    trainer_type: ClassVar[Literal["rl", "solo_agent"]] = "rl"
    trainer_name: ClassVar[str] = ""
    # Whether the trainer computes on ``settings.device`` (resolved when it is built, see
    # :func:`nip_core.settings.resolve_device`); pure-text trainers do not.
    uses_torch_device: ClassVar[bool] = False
    State: ClassVar[type[TrainerState]] = TrainerState
    # The parameters model the registry looks a ``critic_switch`` path up in.
    hyper_params_model: ClassVar[type[HyperParameters]] = HyperParameters

    def __init__(self, hyper_params: HyperParameters, settings: ExperimentSettings | None = None,
                 run: Run | None = None, hooks: TrainerHooks | None = None, stat_logger=None):
        self.hyper_params = hyper_params
        self.settings = settings or ExperimentSettings()
        persist = run is not None and not self.settings.test_run
        self.run: Run | NullRun = run if persist else NullRun(getattr(run, "run_id", None) or self.settings.run_id,
                                                              hyper_params)
        self.hooks = hooks or TrainerHooks()
        self.logger = logging.getLogger(f"nipflow.{self.trainer_name or type(self).__name__}")
        if stat_logger is None:
            from nip_core.logging import build_stat_logger

            stat_logger = build_stat_logger(hyper_params, self.settings, self.run)
        self.stat_logger = stat_logger
        self.state = self._load_or_initialise_state()

    # -- state -------------------------------------------------------------------------------

    def _initialise_state(self) -> TrainerState:
        return self.State()

    def _load_or_initialise_state(self) -> TrainerState:
        try:
            return self.run.load_state(self.State)
        except CheckpointNotFoundError:
            return self._initialise_state()

    def reload_state(self) -> None:
        """Read the state again from the run store.

        Drivers call it right after taking the run's lease: the trainer was built (and
        its state read) before, and a previous driver may have moved the run on since.
        """
        self.state = self._load_or_initialise_state()

    def save_state(self) -> None:
        """Write the state atomically to the run store (no-op without a run)."""
        self.run.save_state(self.state)

    # -- progress ----------------------------------------------------------------------------

    def make_iteration_context(self, total: int, description: str, initial: int = 0) -> IterationContext:
        return IterationContext(total, description, enabled=progress_enabled(self.settings.show_progress),
                                on_step=self.hooks.on_progress, initial=initial)

    def get_total_num_iterations(self) -> int:
        """Sum of the totals of the trainer's progress-bar loops."""
        return total_iterations(self)

    # -- logging -----------------------------------------------------------------------------

    def log_run_artifact(self, prefix: str, artifact_type: str, rel_paths: list[str]) -> None:
        """Log run-store files as a new version of the artifact ``{prefix}_{run_id}`` (W&B naming).

        Names follow the original library: ``checkpoint_{id}``, ``state_{id}``,
        ``full_rollouts_{id}``, ``raw_transcript_{id}``. Files of a remote run store are
        staged through a temporary directory. No-op without a run.
        """
        if not self.run.persistent:
            return
        storage = self.run.storage
        if storage.local:
            self.stat_logger.log_artifact(f"{prefix}_{self.run.run_id}", artifact_type,
                                          [storage.full(rel) for rel in rel_paths])
            return
        import os
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            paths = []
            for rel in rel_paths:
                path = os.path.join(tmp, rel.replace("/", "__"))
                with open(path, "wb") as f:
                    f.write(storage.read_bytes(rel))
                paths.append(path)
            self.stat_logger.log_artifact(f"{prefix}_{self.run.run_id}", artifact_type, paths)

    def log_stats(self, stats: dict[str, Any], iteration: int | None, kind: str = "train") -> None:
        self.stat_logger.log(stats, step=iteration, kind=kind)
        if iteration is not None and kind == "train":
            self.hooks.on_iteration_end(iteration, stats)

    # -- main entry --------------------------------------------------------------------------

    @abstractmethod
    def train(self) -> None:
        """Run the whole experiment (resuming from the saved state if there is one)."""

    def close(self) -> None:
        self.stat_logger.close()


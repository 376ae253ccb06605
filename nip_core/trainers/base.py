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
from nip_core.runs.store import package_version
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

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        refuse_replaced_nip_members(cls)

    def __init__(self, hyper_params: HyperParameters, scenario_instance: Any = None,
                 settings: ExperimentSettings | None = None, *, run: Run | None = None,
                 hooks: TrainerHooks | None = None, stat_logger=None):
        refuse_settings_as_scenario(type(self), scenario_instance)
        self.hyper_params = hyper_params
        self.scenario_instance = scenario_instance
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

    def make_iteration_context(self, total: int, description: str, initial: int = 0,
                               show_bar: bool = True) -> IterationContext:
        """A progress context: a bar where ``show_bar`` and the settings allow, progress hooks always."""
        return IterationContext(total, description,
                                enabled=show_bar and progress_enabled(self.settings.show_progress),
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
        # a mutable file stored under an epoch tag is logged under its plain name
        stored = {rel: self.run.stored_name(rel) or rel for rel in rel_paths}
        if storage.local and all(name == rel for rel, name in stored.items()):
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
                    f.write(storage.read_bytes(stored[rel]))
                paths.append(path)
            self.stat_logger.log_artifact(f"{prefix}_{self.run.run_id}", artifact_type, paths)

    def log_stats(self, stats: dict[str, Any], iteration: int | None, kind: str = "train") -> None:
        self.stat_logger.log(stats, step=iteration, kind=kind)
        if iteration is not None and kind == "train":
            self.hooks.on_iteration_end(iteration, stats)

    # -- what nip's trainers also offer ------------------------------------------------------

    @property
    def scenario(self) -> Any:
        """The scenario instance (``scenario_instance``, nip's name; this shorter one is nipflow's)."""
        return self.scenario_instance

    @property
    def max_message_rounds(self) -> int:
        """The most message rounds the protocol allows."""
        return int(self.protocol_handler.max_message_rounds)

    @property
    def num_agents(self) -> int:
        """How many agents the scenario has."""
        return len(self.agent_names)

    def _get_metadata(self) -> dict[str, Any]:
        """What the checkpoints record about the code that wrote them (``package_version``,
        ``package_name``, ``git_sha`` of a git checkout, else None); override to add."""
        return code_metadata()

    # -- main entry --------------------------------------------------------------------------

    @abstractmethod
    def train(self) -> None:
        """Run the whole experiment (resuming from the saved state if there is one)."""

    def close(self) -> None:
        self.stat_logger.close()


def refuse_settings_as_scenario(cls: type, scenario_instance: Any) -> None:
    """Raise ``TypeError`` for the constructor order nipflow used before nip's (settings second)."""
    if isinstance(scenario_instance, ExperimentSettings):
        raise TypeError(f"{cls.__name__}(hyper_params, scenario_instance, settings): the second argument is the "
                        f"scenario instance, as in nip (got the settings; pass settings=... or as the third)")


_RUN_STORE = ("checkpoints live in the run store: self.run (RunStore(settings.runs_dir).open_run(run_id)) holds "
              "hyper_params.json, state.json, metadata.json and checkpoints/iter_N.pt with its manifest")

#: Members of nip's trainers that nipflow replaces (docs/behaviour.md#b42): a subclass that
#: defines one would be silently ignored, so it is refused with the replacement's name.
REPLACED_NIP_MEMBERS: dict[str, str] = {
    "_add_file_to_wandb_artifact": "run-store files become W&B artifact versions through "
                                   "log_run_artifact(prefix, artifact_type, rel_paths); override that",
    "get_checkpoint_base_dir_from_run_id": _RUN_STORE,
    "checkpoint_base_dir": _RUN_STORE,
    "checkpoint_params_path": _RUN_STORE,
    "checkpoint_state_path": _RUN_STORE,
    "checkpoint_metadata_path": _RUN_STORE,
    "PRETRAINED_MODEL_CACHE_PARAM_KEYS": "nipflow keeps no pretrained-model cache: pretrain_agents' result is the "
                                         "run's iteration-0 checkpoint",
}


def refuse_replaced_nip_members(cls: type) -> None:
    """Raise ``TypeError`` if ``cls`` defines a member of nip's trainers that nipflow never reads."""
    for name, replacement in REPLACED_NIP_MEMBERS.items():
        if name in cls.__dict__:
            raise TypeError(f"{cls.__qualname__}.{name}: nipflow does not use nip's {name} ({replacement})")


_GIT_SHA: list[str | None] = []


def code_metadata() -> dict[str, Any]:
    """``package_name``, ``package_version`` and the ``git_sha`` of the checkout nipflow runs
    from (None when it is not a git checkout); the sha is looked up once per process."""
    if not _GIT_SHA:
        import subprocess
        from pathlib import Path

        try:
            out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent,
                                 capture_output=True, text=True, timeout=10)
            _GIT_SHA.append(out.stdout.strip() if out.returncode == 0 else None)
        except (OSError, subprocess.SubprocessError):
            _GIT_SHA.append(None)
    return {"package_name": "nipflow", "package_version": package_version(), "git_sha": _GIT_SHA[0]}

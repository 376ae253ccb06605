"""What the orchestration (Prefect flows and tasks) needs from a trainer, as protocols.

Flows dispatch with ``isinstance`` on these (they are ``runtime_checkable``: the check
is that the members exist) instead of probing single methods:

* :class:`StagedTrainer`: a pure-text trainer driven stage by stage
  (:class:`~nip_core.trainers.pure_text_base.PureTextRlTrainer`);
* :class:`RecoverableStagedTrainer`: a staged trainer that also keeps the summary of each
  finished stage, so an orchestrator can rebuild the result of a stage it lost track of;
* :class:`IterationTrainer`: a trainer run in blocks of iterations
  (:class:`~nip_core.trainers.tensordict_rl.TensorDictRlTrainer`).

Any other trainer is run with ``train()`` in one piece.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class StagedTrainer(Protocol):
    """A trainer that runs one stage at a time and saves its state after each.

    Attributes
    ----------
    state
        The trainer state: ``iteration`` and ``train_loop_stage``.
    State
        The state's class (a fresh one gives the starting position of a run).
    run
        The run in the run store.
    settings
        ``ExperimentSettings`` (``fine_tune_wait_timeout_s`` bounds a suspended wait).
    """

    state: Any
    State: Any
    run: Any
    settings: Any

    def next_stage(self) -> tuple[int, str]:
        """The position to run next, ``(iteration, stage)``; ``stage == "done"`` at the end."""

    def reload_state(self) -> None:
        """Read the state again from the run store (and whatever the trainer derives from it)."""

    def run_stage(self, stage: str) -> dict[str, Any]:
        """Run ``stage`` (the one :meth:`next_stage` names), save the state, return a summary.

        The summary holds ``iteration``, ``stage``, ``next_iteration``, ``next_stage``.
        """

    def poll_fine_tune_jobs(self) -> dict[str, str]:
        """Group -> status of the fine-tune jobs awaited now (``{}`` when none), without waiting."""

    def close(self) -> None:
        """Release what the trainer holds (loggers)."""


@runtime_checkable
class RecoverableStagedTrainer(StagedTrainer, Protocol):
    """A :class:`StagedTrainer` that stores the summary of every finished stage."""

    def stored_stage_summary(self, iteration: int, stage: str) -> dict[str, Any] | None:
        """The summary :meth:`run_stage` returned for that stage, or ``None``."""


@runtime_checkable
class IterationTrainer(Protocol):
    """A trainer whose iterations run in blocks ``[start, stop)``, each ending in a checkpoint."""

    state: Any
    run: Any
    hyper_params: Any

    def run_iterations(self, start: int, stop: int) -> None:
        """Run iterations ``start .. stop - 1`` from the checkpoint at ``start``."""

    def close(self) -> None:
        """Release what the trainer holds (loggers)."""

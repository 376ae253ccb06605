"""One Prefect task per pure-text stage, each a thin call to ``trainer.run_stage(stage)``.

A stage task receives the run's spec and the iteration (serialisable; see
:mod:`tasks.trainers` for how it gets its trainer), never a live trainer.

A stage's result (the small JSON summary ``run_stage`` returns) is persisted in the run
store under the key ``(run_id, params_hash, iteration, stage)``; see
:mod:`tasks.persistence`. Task runs are named ``sample_rollouts[it=3]``.

Before executing, a task re-reads the trainer state from the run store: another process
may have advanced it (a race, or a crash between writing the state and persisting the
result). A stage the state shows as already done is not executed again; its summary is
rebuilt from the state.
"""

from __future__ import annotations

from typing import Any

from prefect import Task, task

from nip_core.trainers.interfaces import RecoverableStagedTrainer, StagedTrainer
from nip_core.trainers.stage_machine import STAGE_ORDER, Stage, stage_position
from tasks.persistence import task_options_for
from tasks.trainers import RunSpecLike, task_trainer

#: The stages that have a task (every stage but ``done``), in diagram order.
_TASKED_STAGES: tuple[Stage, ...] = tuple(s for s in STAGE_ORDER if s is not Stage.DONE)


def refresh_state(trainer: StagedTrainer) -> None:
    """Reload the trainer's state from the run store (no-op without a stored state), through
    the trainer's own :meth:`reload_state` (a text trainer pushes its groups' states too)."""
    if trainer.run.has_state():
        trainer.reload_state()


def initial_position(trainer: StagedTrainer) -> tuple[int, str]:
    """Where a fresh run of ``trainer`` starts in the stage diagram."""
    fresh = trainer.State()
    return fresh.iteration, str(fresh.train_loop_stage)


def execute_stage(trainer: StagedTrainer, stage: str, iteration: int) -> dict[str, Any]:
    """Run ``stage`` of ``iteration`` unless the stored state shows it done.

    Returns the stage summary (``iteration``, ``stage``, ``next_iteration``,
    ``next_stage`` and optional ``metrics``/``jobs``).
    """
    refresh_state(trainer)
    current = trainer.next_stage()
    if stage_position(*current) > stage_position(iteration, stage):
        stored = trainer.stored_stage_summary(iteration, stage) if isinstance(trainer, RecoverableStagedTrainer) \
            else None
        summary = stored or {"iteration": iteration, "stage": str(stage), "next_iteration": int(current[0]),
                             "next_stage": str(current[1])}
        return {**summary, "recovered_from_state": True}
    # A stage ahead of the state is refused by run_stage (StageOrderError).
    return dict(trainer.run_stage(stage))


def _make_stage_task(stage: Stage) -> Task:
    stage = stage.value

    def run(spec: RunSpecLike, iteration: int) -> dict[str, Any]:
        with task_trainer(spec) as trainer:
            return execute_stage(trainer, stage, iteration)

    run.__name__ = stage
    run.__qualname__ = stage
    run.__doc__ = f"The ``{stage}`` stage of one iteration (thin call into nip_core)."
    return task(run, name=stage, task_run_name=f"{stage}[it={{iteration}}]",
                retries=0)


STAGE_TASKS: dict[Stage, Task] = {stage: _make_stage_task(stage) for stage in _TASKED_STAGES}


def _stage_key(stage: str):
    return lambda inputs: (f"it{inputs['iteration']}", stage)


def run_stage_task(spec: RunSpecLike, stage: str, iteration: int, *, return_state: bool = False):
    """Call the task of ``stage`` for ``spec``'s run with its run-keyed cache and storage.

    Must be called inside a flow run. With ``return_state=True`` the Prefect state is
    returned (``state.name == "Cached"`` when the stage was not executed).
    """
    stage = Stage(stage).value
    bound = STAGE_TASKS[Stage(stage)].with_options(**task_options_for(spec, _stage_key(stage)))
    return bound(spec, iteration, return_state=return_state)

"""The stage machine of the pure-text trainers: the stages and every transition, in one place.

:class:`Stage` names the stages (the values are the strings stored in ``state.json`` and
used in Prefect task names). :func:`next_stage` is the whole transition function: given
the trainer state *after* a stage function ran and the hyper-parameters, it returns the
``(iteration, stage)`` the run moves to. It is pure (no I/O), so the diagram in
``docs/architecture.md`` is checked against it by a test.

Transitions (``i`` = ``state.iteration``, ``N`` = ``rl.num_iterations``, *rerun* =
``base_run.base_run_type == "rerun_tests"``)::

    from                   condition                                  to
    ---------------------  -----------------------------------------  ----------------------------
    sample_rollouts        not rerun                                  (i, log_stats)
    sample_rollouts        rerun, base run has iteration i            (i, test_during_training)
    sample_rollouts        rerun, base run never reached iteration i  (N, test)
    log_stats              always                                     (i, test_during_training)
    test_during_training   i >= N - 1 (last iteration)                (N, test)
    test_during_training   rerun, i < N - 1                           (i + 1, sample_rollouts)
    test_during_training   not rerun, i < N - 1                       (i, create_fine_tune_jobs)
    create_fine_tune_jobs  always                                     (i, await_fine_tune_jobs)
    await_fine_tune_jobs   always                                     (i + 1, sample_rollouts)
    test                   always                                     (i, done)

"Base run has iteration i" is read from the state: the rerun's ``sample_rollouts`` stage
sets ``base_run_state_artifact_version = i`` when it loads the base run's models of
iteration ``i`` and leaves it alone otherwise.

Stages ``test_during_training`` and ``test`` split the test loop of the test scheme
(``text_rl.test_scheme``): ``test_during_training`` tests the iterations before the last
one, ``test`` (after training) tests the final models, i.e. those of iteration ``N - 1``.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, NamedTuple

from nip_core.errors import NipflowError


class Stage(StrEnum):
    """A stage of the pure-text training loop (values as stored in ``state.json``)."""

    SAMPLE_ROLLOUTS = "sample_rollouts"
    LOG_STATS = "log_stats"
    TEST_DURING_TRAINING = "test_during_training"
    CREATE_FINE_TUNE_JOBS = "create_fine_tune_jobs"
    AWAIT_FINE_TUNE_JOBS = "await_fine_tune_jobs"
    TEST = "test"
    DONE = "done"


#: The stages in diagram order (``done`` last); orders the stages of one iteration.
STAGE_ORDER: tuple[Stage, ...] = tuple(Stage)


class Position(NamedTuple):
    """Where a run is: the iteration and the stage to run next."""

    iteration: int
    stage: Stage


class StageOrderError(NipflowError, RuntimeError):
    """A stage was asked for that is not the one the state is at."""

    def __init__(self, asked: str, iteration: int, current: str):
        super().__init__(f"stage '{asked}' requested but the state is at iteration {iteration}, stage '{current}'")


def is_rerun(params: Any) -> bool:
    """Whether ``params`` (``HyperParameters``) describe a rerun-tests run."""
    return params.base_run.base_run_type == "rerun_tests"


def next_stage(state: Any, params: Any) -> Position:
    """The position after the stage ``state`` is at has run (see the module's table).

    Parameters
    ----------
    state
        The trainer state (``PureTextRlTrainer.State``) as the stage function left it:
        ``iteration``, ``train_loop_stage`` and ``base_run_state_artifact_version``.
    params
        The ``HyperParameters``: ``rl.num_iterations`` and ``base_run.base_run_type``.

    Raises
    ------
    StageOrderError
        If the state is at ``done`` (no stage follows it).
    """
    i, stage = int(state.iteration), Stage(state.train_loop_stage)
    n, rerun = int(params.rl.num_iterations), is_rerun(params)
    if stage is Stage.SAMPLE_ROLLOUTS:
        if not rerun:
            return Position(i, Stage.LOG_STATS)
        if state.base_run_state_artifact_version == i:
            return Position(i, Stage.TEST_DURING_TRAINING)
        return Position(n, Stage.TEST)
    if stage is Stage.LOG_STATS:
        return Position(i, Stage.TEST_DURING_TRAINING)
    if stage is Stage.TEST_DURING_TRAINING:
        if i >= n - 1:
            return Position(n, Stage.TEST)
        return Position(i + 1, Stage.SAMPLE_ROLLOUTS) if rerun else Position(i, Stage.CREATE_FINE_TUNE_JOBS)
    if stage is Stage.CREATE_FINE_TUNE_JOBS:
        return Position(i, Stage.AWAIT_FINE_TUNE_JOBS)
    if stage is Stage.AWAIT_FINE_TUNE_JOBS:
        return Position(i + 1, Stage.SAMPLE_ROLLOUTS)
    if stage is Stage.TEST:
        return Position(i, Stage.DONE)
    raise StageOrderError(stage.value, i, "done (no stage follows it)")


def stage_position(iteration: int, stage: str) -> tuple[int, int]:
    """A sort key of positions: by iteration, then by :data:`STAGE_ORDER`."""
    return (int(iteration), STAGE_ORDER.index(Stage(stage)))

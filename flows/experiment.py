"""``train_experiment``: the entry flow of every deployment and of ``nipflow run``.

It validates the parameters into ``HyperParameters``, opens (or resumes) the run in the
run store, builds the trainer with :class:`~flows.observability.PrefectHooks`, and
dispatches on the trainer's interface:

* a pure-text trainer (``StagedTrainer`` of :mod:`nip_core.trainers.interfaces`) runs the stage machine of
  :mod:`flows.pure_text` in this flow run (a fine-tune wait may suspend it, which Prefect
  only allows for a top-level flow run, hence no subflow);
* a TensorDict trainer (``IterationTrainer``) runs the GPU-tagged blocks of
  :mod:`flows.rl_blocks`;
* any other trainer runs ``train()`` as a single task.

Each field of :class:`~flows.parameters.ExperimentParameters` is a top-level flow
parameter (Prefect merges a run's parameters with its deployment's one top-level key at a
time), every one optional: a deployment's parameters can then be edited and saved in the
UI, and a run without a scenario or trainer fails with an error naming
``parameters.scenario``/``parameters.trainer``.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger, task

from flows.leases import driving
from flows.observability import flow_recording
from flows.form_fields import (
    DEFAULT_BLOCK_SIZE,
    BlockSizeField,
    DatasetField,
    DeviceField,
    FramesPerBatchField,
    NumIterationsField,
    OnParamsMismatchField,
    OverridesField,
    ParamsField,
    ProtocolField,
    ProverModelField,
    RolloutsField,
    RunIdField,
    RunsDirField,
    ScenarioField,
    SeedField,
    SettingsOverridesField,
    TrainerField,
    UseWandbField,
    VerifierModelField,
    WaitModeField,
    WarmStartFromField,
    described_by,
)
from flows.parameters import ExperimentParameters, RunSpec
from flows.pure_text import run_pure_text
from flows.rl_blocks import run_tensordict
from flows.run_history import experiment_name, mark_completed
from flows.trainer_access import build_flow_trainer, current_flow_run_id, open_trainer, remember_trainer
from nip_core.settings import AUTO_DEVICE
from nip_core.trainers.interfaces import IterationTrainer, StagedTrainer
from tasks.trainers import release_trainer, task_trainer

# ``build_flow_trainer`` is re-exported for the flows that resume a run from its stored
# parameters (:mod:`flows.watcher`); the rest of :mod:`flows.trainer_access` is imported
# from there.
__all__ = ["build_flow_trainer", "driven_by", "run_experiment", "run_trainer", "train_experiment", "train_whole"]


def driven_by(trainer: Any) -> str:
    """How a flow drives ``trainer``: ``"stages"`` (``run_stage``), ``"blocks"`` (``run_iterations``
    in RL blocks) or ``"train"`` (its ``train()`` in one task), from the interface it implements.

    See :mod:`nip_core.trainers.interfaces` (``StagedTrainer``, ``IterationTrainer``). This is not
    a kind of trainer (that is ``trainer_kind`` of :mod:`nip_core.parameters.trainer_specs`).
    """
    if isinstance(trainer, StagedTrainer):
        return "stages"
    if isinstance(trainer, IterationTrainer):
        return "blocks"
    return "train"


@task(name="train", task_run_name="train[{run_id}]")
def train_whole(spec: RunSpec, run_id: str) -> dict[str, Any]:
    """A trainer without stages or blocks: ``train()`` of ``spec``'s run in one task."""
    with task_trainer(spec) as trainer:
        trainer.train()
        return {"run_id": run_id, "iteration": int(trainer.state.iteration)}


def overrides_train(trainer: Any, driver: str) -> bool:
    """Whether ``trainer``'s class overrides ``train()`` (or, for RL blocks, nip's
    ``_train_and_test()``) below the class that implements its ``driver``.

    The flows drive a staged trainer through ``run_stage`` and an iteration trainer through
    ``run_iterations``; a ``train()`` defined in a subclass of the class that defines the
    driver (a user's subclass of a built-in trainer) would be bypassed. A class that
    defines both (its own loop, as a fake or a new base does) is not an override.
    """
    mro = type(trainer).__mro__
    method = "run_stage" if driver == "stages" else "run_iterations"

    def defined_at(name: str) -> int:
        return next((i for i, cls in enumerate(mro) if name in cls.__dict__), len(mro))

    overridden = ["train"] + (["_train_and_test"] if driver == "blocks" else [])
    return any(defined_at(name) < defined_at(method) for name in overridden)


def run_trainer(trainer: Any, parameters: ExperimentParameters) -> dict[str, Any]:
    """Dispatch ``trainer`` to the flow logic that drives it (inside a flow run).

    A staged or iteration trainer whose class overrides ``train()`` runs that ``train()``
    in one task, as a plain trainer does: the stages and RL blocks would bypass the override.
    """
    driver = driven_by(trainer)
    if driver != "train" and overrides_train(trainer, driver):
        get_run_logger().warning(
            "%s overrides train() (or _train_and_test()): it runs as one task, without per-stage results, "
            "RL blocks or fine-tune suspension (override the stage or iteration hooks instead to keep them)",
            type(trainer).__name__)
        driver = "train"
    get_run_logger().info("run %s (%s trainer, driven by %s): run store %s", trainer.run.run_id,
                          trainer.hyper_params.trainer, driver, trainer.run.location)
    if driver == "stages":
        return run_pure_text(trainer, parameters.wait_mode)
    if driver == "blocks":
        return run_tensordict(trainer, parameters.block_size)
    spec = RunSpec.for_trainer(trainer)
    remember_trainer(spec, trainer)  # the task uses this trainer instead of building another
    return train_whole(spec, trainer.run.run_id)


@flow(name="train_experiment", persist_result=True)
@described_by(ExperimentParameters)
def train_experiment(
    scenario: ScenarioField = None,
    trainer: TrainerField = None,
    protocol: ProtocolField = None,
    dataset: DatasetField = None,
    num_iterations: NumIterationsField = None,
    seed: SeedField = None,
    frames_per_batch: FramesPerBatchField = None,
    rollouts_per_iteration: RolloutsField = None,
    prover_model: ProverModelField = None,
    verifier_model: VerifierModelField = None,
    params: ParamsField = None,
    overrides: OverridesField = None,
    run_id: RunIdField = None,
    runs_dir: RunsDirField = None,
    device: DeviceField = AUTO_DEVICE,
    use_wandb: UseWandbField = False,
    block_size: BlockSizeField = DEFAULT_BLOCK_SIZE,
    wait_mode: WaitModeField = "auto",
    on_params_mismatch: OnParamsMismatchField = "refuse",
    warm_start_from: WarmStartFromField = None,
    settings_overrides: SettingsOverridesField = None,
) -> dict[str, Any]:
    """Train one experiment (new or resumed).

    Every field of the form is a flow parameter of its own, so that a run's parameters
    merge with its deployment's field by field (``prefect deployment run
    'train_experiment/nip-gi-ppo' --param run_id=gi-1``). All are optional, so that a
    deployment can be edited and saved in the UI: a run with neither a scenario nor a
    trainer fails at once with a ``ParameterError`` naming ``parameters.scenario`` /
    ``parameters.trainer``.
    """
    return run_experiment(ExperimentParameters.from_flow_parameters(locals()))


def run_experiment(parameters: ExperimentParameters) -> dict[str, Any]:
    """The body of :func:`train_experiment` (also run by ``scheduled_retraining`` in its own flow run)."""
    trainer = open_trainer(parameters.run_spec(current_flow_run_id()), parameters.warm_start_from)
    try:
        # one driver per run, on any number of hosts; the result card at the end, however it ends
        with driving(trainer, **flow_recording(trainer)):
            result = run_trainer(trainer, parameters)
            mark_completed(trainer.run, experiment_name(trainer.hyper_params))
    finally:
        release_trainer(trainer)  # no task of this process uses it after this flow run
        trainer.close()
    return {**result, "params_hash": trainer.run.params_hash, "trainer": trainer.hyper_params.trainer,
            "scenario": trainer.hyper_params.scenario}

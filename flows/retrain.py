"""Scheduled retraining: a new run warm-started from the latest successful run.

A run that a flow finished successfully is marked in its ``metadata.json``
(``completed_by_flow``, ``experiment``). ``scheduled_retraining`` (a cron deployment)
finds the newest such run of the same experiment in the run store, copies its final
checkpoint and final fine-tuned model names into the new run's ``warm_start/`` folder
(recording ``metadata.warm_start_from``), and trains the new run, whose trainer starts
from those models (``metadata.warm_started``; see :mod:`nip_core.trainers.warm_start`).
The run-store helpers live in :mod:`flows.run_history` and are re-exported here.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger

from flows.experiment import run_experiment
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
    described_by,
)
from flows.parameters import ExperimentParameters
from flows.run_history import apply_warm_start, experiment_name, latest_successful_run, mark_completed
from flows.trainer_access import current_flow_run_id
from nip_core.settings import AUTO_DEVICE
from nip_core.trainers.warm_start import WARM_START_DIR, WarmStartError

__all__ = ["WARM_START_DIR", "WarmStartError", "apply_warm_start", "experiment_name", "latest_successful_run",
           "mark_completed", "scheduled_retraining"]


@flow(name="scheduled_retraining", persist_result=True)
@described_by(ExperimentParameters)
def scheduled_retraining(
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
    settings_overrides: SettingsOverridesField = None,
) -> dict[str, Any]:
    """Train a new run of the experiment from the latest successful run's models.

    The fields are those of ``train_experiment`` but ``warm_start_from``, which this flow
    finds (the newest run the flows completed of the same experiment). Without ``run_id``
    each flow run trains a new run (its id derives from the flow run's).
    """
    parameters = ExperimentParameters.from_flow_parameters(locals())
    spec = parameters.run_spec(current_flow_run_id())
    name, run_id = experiment_name(spec.hyper_params()), spec.settings["run_id"]
    previous = latest_successful_run(spec.experiment_settings().runs_dir, name, exclude=run_id)
    get_run_logger().info("retraining %s as run %s, warm start from %s", name, run_id, previous)
    return run_experiment(parameters.model_copy(update={"run_id": run_id, "warm_start_from": previous}))

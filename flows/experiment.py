"""``train_experiment``: the entry flow of every deployment and of ``nipflow run``.

It validates the parameters into ``HyperParameters``, opens (or resumes) the run in the
run store, builds the trainer with :class:`~flows.observability.PrefectHooks`, and
dispatches on the trainer's interface:

* a pure-text trainer (``StagedTrainer`` of :mod:`nip_core.trainers.interfaces`) runs the stage machine of
  :mod:`flows.pure_text` in this flow run (a fine-tune wait may suspend it, which Prefect
  only allows for a top-level flow run, hence no subflow);
* a TensorDict trainer (``IterationTrainer``) runs the GPU-tagged blocks of
  :mod:`flows.tensordict`;
* any other trainer runs ``train()`` as a single task.

The one parameter, ``parameters``, defaults to an empty form: a deployment's parameters
can then be edited and saved in the UI, and a run without a scenario or trainer fails
with an error naming ``parameters.scenario``/``parameters.trainer``.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger, task

from flows.parameters import ExperimentParameters, RunSpec
from nip_core.parameters import HyperParameters
from nip_core.settings import ExperimentSettings

# Trainers built in this process, by (run_id, params_hash): local subflows reuse them.
_LIVE_TRAINERS: dict[tuple[str, str], Any] = {}


def current_work_pool() -> str | None:
    """The work pool of this flow run when it is deployed (``None`` otherwise, or unknown).

    The id comes from ``prefect.runtime`` (the run context, or ``PREFECT__FLOW_RUN_ID``,
    which a worker sets in the flow-run process, so this also works while Prefect
    validates the parameters, before the run's context exists); the pool from the API.
    """
    run_id = current_flow_run_id()
    if run_id is None:
        return None
    from prefect.client.orchestration import get_client

    try:
        with get_client(sync_client=True) as client:
            return client.read_flow_run(run_id).work_pool_name
    except Exception:  # noqa: BLE001 - only used to word an error message
        return None


def where_this_runs() -> str:
    """``host 'h', work pool 'p'`` (or ``..., not in a work pool``) for error messages."""
    import socket

    pool = current_work_pool()
    return f"host {socket.gethostname()!r}, " + (f"work pool {pool!r}" if pool else "not in a work pool")


def check_device_here(device: str, field: str = "parameters.device") -> str:
    """Resolve ``device`` on this host (:func:`nip_core.settings.resolve_device`).

    Raises
    ------
    DeviceUnavailableError
        Naming ``field``, this host and its work pool, if ``device`` is a CUDA device
        that this host does not have.
    """
    from nip_core.settings import DeviceUnavailableError, resolve_device

    try:
        return resolve_device(device, field=field)
    except DeviceUnavailableError as e:
        raise e.naming(field, where_this_runs()) from None


def build_flow_trainer(hyper_params: HyperParameters, settings: ExperimentSettings):
    """Build the trainer for a flow, with Prefect artifact hooks, opening its run.

    Raises
    ------
    DeviceUnavailableError
        If the trainer computes on a device (TensorDict trainers) that this host does
        not have: names ``parameters.device``, the host and the work pool.
    """
    from flows.observability import PrefectHooks
    from nip_core.settings import DeviceUnavailableError
    from nip_core.trainers import build_trainer

    hooks = PrefectHooks(settings.run_id or "run", getattr(hyper_params.rl, "num_iterations", 1))
    try:
        return build_trainer(hyper_params, settings, hooks=hooks)
    except DeviceUnavailableError as e:
        raise e.naming("parameters.device", where_this_runs()) from None


def remember_trainer(trainer: Any) -> None:
    _LIVE_TRAINERS[(trainer.run.run_id, trainer.run.params_hash)] = trainer


def forget_trainer(spec: RunSpec) -> None:
    """Drop this process's live trainer of ``spec``'s run (the next use builds a fresh one)."""
    _LIVE_TRAINERS.pop((spec.settings.get("run_id"), spec.hyper_params().params_hash()), None)


def trainer_from_spec(spec: RunSpec):
    """The live trainer of this process for ``spec``'s run, or a newly built one."""
    hyper_params, settings = spec.hyper_params(), spec.experiment_settings()
    live = _LIVE_TRAINERS.get((settings.run_id, hyper_params.params_hash()))
    if live is not None:
        return live
    trainer = build_flow_trainer(hyper_params, settings)
    remember_trainer(trainer)
    return trainer


def current_flow_run_id() -> str | None:
    from prefect.runtime import flow_run

    return flow_run.id


def open_trainer(parameters: ExperimentParameters):
    hyper_params = parameters.hyper_params()
    settings = parameters.settings(hyper_params, current_flow_run_id())
    if parameters.warm_start_from:
        from flows.retrain import apply_warm_start

        trainer = build_flow_trainer(hyper_params, settings)
        apply_warm_start(trainer.run, parameters.warm_start_from, settings.runs_dir)
        return trainer
    return build_flow_trainer(hyper_params, settings)


def trainer_kind(trainer: Any) -> str:
    """``"pure_text"``, ``"tensordict"`` or ``"plain"``: the interface the trainer implements.

    See :mod:`nip_core.trainers.interfaces` (``StagedTrainer``, ``IterationTrainer``).
    """
    from nip_core.trainers.interfaces import IterationTrainer, StagedTrainer

    if isinstance(trainer, StagedTrainer):
        return "pure_text"
    if isinstance(trainer, IterationTrainer):
        return "tensordict"
    return "plain"


@task(name="train", task_run_name="train[{run_id}]")
def train_whole(trainer: Any, run_id: str) -> dict[str, Any]:
    """A trainer without stages or blocks: ``train()`` in one task."""
    trainer.train()
    return {"run_id": run_id, "iteration": int(trainer.state.iteration)}


def run_trainer(trainer: Any, parameters: ExperimentParameters) -> dict[str, Any]:
    """Dispatch ``trainer`` to the flow logic of its kind (inside a flow run)."""
    kind = trainer_kind(trainer)
    get_run_logger().info("run %s (%s, %s trainer): run store %s", trainer.run.run_id,
                          trainer.hyper_params.trainer, kind, trainer.run.location)
    if kind == "pure_text":
        from flows.pure_text import run_pure_text

        return run_pure_text(trainer, parameters.wait_mode)
    if kind == "tensordict":
        from flows.tensordict import run_tensordict

        return run_tensordict(trainer, parameters.block_size)
    return train_whole(trainer, trainer.run.run_id)


@flow(name="train_experiment", persist_result=True)
def train_experiment(parameters: ExperimentParameters = ExperimentParameters()) -> dict[str, Any]:
    """Train one experiment (new or resumed) described by ``parameters``.

    ``parameters`` defaults to an empty form (never changed by a run, so one shared
    default is safe): with neither a scenario nor a trainer the run fails at once with a
    ``ParameterError`` naming ``parameters.scenario``/``parameters.trainer``.
    """
    from flows.leases import driving
    from flows.observability import reporting

    trainer = open_trainer(parameters)
    try:
        # one driver per run, on any number of hosts; the result card at the end, however it ends
        with driving(trainer), reporting(trainer):
            result = run_trainer(trainer, parameters)
            from flows.retrain import experiment_name, mark_completed

            mark_completed(trainer.run, experiment_name(parameters))
    finally:
        trainer.close()
    return {**result, "params_hash": trainer.run.params_hash, "trainer": trainer.hyper_params.trainer,
            "scenario": trainer.hyper_params.scenario}

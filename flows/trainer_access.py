"""Trainers inside flow runs: built with Prefect hooks, reused by local subflows, on this host.

Every flow that trains gets its trainer here: :func:`open_trainer` for the entry flow
(from the ``RunSpec`` its form resolves into, warm start included), :func:`trainer_from_spec` for an
RL block (from the parent's ``RunSpec``; a local subflow reuses the trainer its parent
kept with :func:`remember_trainer`). Tasks never receive a trainer: they receive the
``RunSpec`` (:meth:`RunSpec.for_trainer`) and open the run's trainer themselves
(:mod:`tasks.trainers`, whose per-process cache :func:`remember_trainer` fills as an
optimisation only). Device errors name the parameter, the host and the work pool
(:func:`check_device_here`). This module imports no flow module other than
the leaf modules it needs (parameters, observability, run history), so that every flow
can import it at the top.
"""

from __future__ import annotations

import socket
from typing import Any

from prefect.client.orchestration import get_client
from prefect.runtime import flow_run

from flows.observability import PrefectHooks
from flows.parameters import RunSpec
from flows.run_history import apply_warm_start
from nip_core.parameters import HyperParameters
from nip_core.settings import DeviceUnavailableError, ExperimentSettings, resolve_device
from tasks.trainers import forget_trainer, keep_trainer, kept_trainer

__all__ = ["build_flow_trainer", "check_device_here", "current_flow_run_id", "current_work_pool", "forget_trainer",
           "open_trainer", "remember_trainer", "trainer_from_spec", "where_this_runs"]


def current_flow_run_id() -> str | None:
    """The id of the current flow run (``None`` outside one), from ``prefect.runtime``."""
    return flow_run.id


def current_work_pool() -> str | None:
    """The work pool of this flow run when it is deployed (``None`` otherwise, or unknown).

    The id comes from ``prefect.runtime`` (the run context, or ``PREFECT__FLOW_RUN_ID``,
    which a worker sets in the flow-run process, so this also works while Prefect
    validates the parameters, before the run's context exists); the pool from the API.
    """
    run_id = current_flow_run_id()
    if run_id is None:
        return None
    try:
        with get_client(sync_client=True) as client:
            return client.read_flow_run(run_id).work_pool_name
    except Exception:  # noqa: BLE001 - only used to word an error message
        return None


def where_this_runs() -> str:
    """``host 'h', work pool 'p'`` (or ``..., not in a work pool``) for error messages."""
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
    from nip_core.trainers import build_trainer  # torch and the trainers: once a flow run builds one

    hooks = PrefectHooks(settings.run_id or "run", getattr(hyper_params.rl, "num_iterations", 1))
    try:
        return build_trainer(hyper_params, settings, hooks=hooks)
    except DeviceUnavailableError as e:
        raise e.naming("parameters.device", where_this_runs()) from None


def remember_trainer(spec: RunSpec, trainer: Any) -> None:
    """Let this process's subflows and tasks of ``spec``'s run use ``trainer`` (an optimisation)."""
    keep_trainer(spec, trainer)


def trainer_from_spec(spec: RunSpec):
    """The trainer this process keeps for ``spec``'s run, or a newly built (and kept) one."""
    hyper_params, settings = spec.hyper_params(), spec.experiment_settings()  # the secrets of this worker
    live = kept_trainer(spec)
    if live is not None:
        return live
    trainer = build_flow_trainer(hyper_params, settings)
    remember_trainer(spec, trainer)
    return trainer


def open_trainer(spec: RunSpec, warm_start_from: str | None = None):
    """Build the trainer of ``spec``'s run in the current flow run, warm-started from the run
    ``warm_start_from`` names, if any."""
    settings = spec.experiment_settings()  # the secrets of this worker
    trainer = build_flow_trainer(spec.hyper_params(), settings)
    if warm_start_from:
        apply_warm_start(trainer.run, warm_start_from, settings.runs_dir)
    return trainer

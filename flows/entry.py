"""``run_through_prefect``: what ``nipflow run`` / ``nipflow resume`` do without ``--direct``.

With ``PREFECT_API_URL`` set, the flow runs against that server (and shows in its UI).
Without it, Prefect's temporary local server is used: ``PREFECT_HOME`` defaults to
``<runs_dir>/.prefect`` for a local run store (else ``~/.nipflow/prefect``), so the run's
flow history sits next to the run, and analytics are off (no network access is tried).
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any, Callable, TypeVar

from nip_core.errors import NipflowError
from nip_core.parameters import HyperParameters
from nip_core.runs.storage import is_url
from nip_core.settings import ExperimentSettings


T = TypeVar("T")


class FlowRunFailedError(NipflowError):
    """The experiment's flow run did not complete (names the run and the final state)."""


def local_prefect_home(settings: ExperimentSettings) -> Path:
    if not is_url(settings.runs_dir):
        return Path(settings.runs_dir).absolute() / ".prefect"
    return Path.home() / ".nipflow" / "prefect"


def _api_url_configured() -> bool:
    if os.environ.get("PREFECT_API_URL"):
        return True
    if "prefect" in sys.modules:  # also set by a profile or a test harness
        from prefect.settings import PREFECT_API_URL

        return bool(PREFECT_API_URL.value())
    return False


STARTUP_TIMEOUT_VAR = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"
#: how long ``nipflow run`` waits for Prefect's temporary server (unless the variable is set)
LOCAL_SERVER_STARTUP_TIMEOUT_S = 120


def _local_server_env(settings: ExperimentSettings) -> dict[str, str]:
    if _api_url_configured():
        return {}
    env = {"PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    if not os.environ.get(STARTUP_TIMEOUT_VAR):
        # Prefect waits 20 s for its temporary server: on a busy machine (a 2-core laptop
        # training, a CI runner) its start (database migrations, app import) takes longer.
        env[STARTUP_TIMEOUT_VAR] = str(LOCAL_SERVER_STARTUP_TIMEOUT_S)
    if not os.environ.get("PREFECT_HOME"):
        home = local_prefect_home(settings)
        home.mkdir(parents=True, exist_ok=True)
        env["PREFECT_HOME"] = str(home)
    return env


def experiment_parameters(params: HyperParameters, settings: ExperimentSettings):
    """The flow parameters equivalent to a CLI run of ``params`` with ``settings``."""
    from flows.parameters import ExperimentParameters
    from flows.secret_blocks import SECRET_SETTINGS_FIELDS

    # Secrets never become flow parameters: the flow reads them on the worker (flows.secret_blocks).
    extra = settings.model_dump(mode="python", exclude={"run_id", "runs_dir", "device", "use_wandb",
                                                         "on_params_mismatch", *SECRET_SETTINGS_FIELDS})
    extra = {k: v for k, v in extra.items() if v != ExperimentSettings.model_fields[k].get_default(
        call_default_factory=True)}
    return ExperimentParameters(params=params.to_dict(), run_id=settings.run_id, runs_dir=settings.runs_dir,
                                device=settings.device, use_wandb=settings.use_wandb,
                                on_params_mismatch=settings.on_params_mismatch, wait_mode="poll",
                                settings_overrides=extra)


def run_through_prefect(params: HyperParameters, settings: ExperimentSettings) -> dict[str, Any]:
    """Run ``train_experiment`` for ``params`` (new or resumed run) and return its result.

    Raises
    ------
    FlowRunFailedError
        If the flow run ends in any state but Completed.
    """
    return in_local_prefect(settings, lambda: _run(params, settings))


def in_local_prefect(settings: ExperimentSettings, fn: Callable[[], T]) -> T:
    """Call ``fn`` (which runs flows) against the configured Prefect API, or the local one.

    Without ``PREFECT_API_URL`` that is Prefect's temporary server on ``<runs_dir>/.prefect``
    (see the module docstring); flow heartbeats are then off: with a temporary in-process
    server nobody else can pick up a dead run, so zombie detection (the reason for
    heartbeats) has no use, and the heartbeat thread's join costs about 1 s per flow run
    (docs/architecture.md#prefect-heartbeats). Deployed runs keep their heartbeats.
    """
    # Prefect's HTTP client logs every request at INFO through httpx: keep the CLI readable.
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger().level))
    env = _local_server_env(settings)
    if "prefect" not in sys.modules or not env:
        os.environ.update(env)
        return _without_local_heartbeats(fn)
    # Prefect read its settings at import: override them for this call only.
    from prefect.settings import PREFECT_HOME, PREFECT_SERVER_ANALYTICS_ENABLED, temporary_settings
    from prefect.settings import PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS as STARTUP_TIMEOUT

    updates = {PREFECT_SERVER_ANALYTICS_ENABLED: False}
    if "PREFECT_HOME" in env:
        updates[PREFECT_HOME] = env["PREFECT_HOME"]
    if STARTUP_TIMEOUT_VAR in env:
        updates[STARTUP_TIMEOUT] = int(env[STARTUP_TIMEOUT_VAR])
    with temporary_settings(updates=updates):
        return _without_local_heartbeats(fn)


def _without_local_heartbeats(fn: Callable[[], T]) -> T:
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    updates = {} if _api_url_configured() else {PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}
    with temporary_settings(updates=updates):
        return fn()


def _run(params: HyperParameters, settings: ExperimentSettings) -> dict[str, Any]:
    from flows.experiment import train_experiment

    state = train_experiment(**experiment_parameters(params, settings).flow_parameters(), return_state=True)
    if not state.is_completed():
        raise FlowRunFailedError(f"run {settings.run_id}: flow run ended {state.name}: {state.message}")
    return state.result()

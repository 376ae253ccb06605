"""``ExperimentSettings``: run-time options that do not change results (not hashed).

The torch device of TensorDict trainers is one of them: ``device`` is ``"auto"`` by
default and is resolved by :func:`resolve_device` where the trainer is built, on the host
that trains (CUDA when that host has it, else the CPU). A run whose RL blocks run on other
hosts passes the device as asked (``"auto"``) to each of them, so each host resolves it
for itself.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from nip_core.errors import NipflowError

ParamsMismatchPolicy = Literal["refuse", "warn", "force"]

AUTO_DEVICE = "auto"
DEVICE_DESCRIPTION = ("torch device of TensorDict trainers: 'auto' (CUDA when the host that trains has it, else "
                      "the CPU; resolved on each host), 'cpu', 'cuda' or 'cuda:N' (fails on a host without it)")


class DeviceUnavailableError(NipflowError):
    """An explicitly requested torch device does not exist on the host that would train.

    Names the field that asked for it (``device``, or ``parameters.device`` in a flow) and
    where (the host, and the work pool of a deployed flow run). Retrying on the same host
    cannot help.
    """

    def __init__(self, device: str, reason: str, *, field: str = "device", where: str | None = None):
        self.device = device
        self.reason = reason
        self.field = field
        self.where = where or f"host {socket.gethostname()!r}"
        super().__init__(f"{field} is {device!r} but {reason} on {self.where}; set {field} to "
                         f"'{AUTO_DEVICE}' (CUDA when the host has it, else the CPU) or 'cpu', or run it where "
                         f"CUDA is available")

    def naming(self, field: str, where: str | None = None) -> "DeviceUnavailableError":
        """The same error, naming ``field`` and ``where`` (what the caller knows better)."""
        return DeviceUnavailableError(self.device, self.reason, field=field, where=where or self.where)


def check_device_name(device: str) -> str:
    """``device`` if it is ``"auto"`` or a torch device string, else ``ValueError``."""
    if device == AUTO_DEVICE or device == "cpu":
        return device
    import torch

    try:
        torch.device(device)
    except (RuntimeError, TypeError, ValueError) as e:
        raise ValueError(f"'{AUTO_DEVICE}' or a torch device (cpu, cuda, cuda:1) expected, got {device!r}: {e}") \
            from None
    return device


def resolve_device(device: str, *, field: str = "device", where: str | None = None) -> str:
    """The torch device to compute on, on this host.

    ``"auto"`` is ``"cuda"`` when ``torch.cuda.is_available()`` and ``"cpu"`` otherwise;
    any other device is returned as it is, after checking that a CUDA device exists here.

    Raises
    ------
    DeviceUnavailableError
        If ``device`` is a CUDA device (``cuda``, ``cuda:N``) that this host does not
        have; the message names ``field`` and ``where``.
    ValueError
        If ``device`` is not a device name at all.
    """
    import torch

    if device == AUTO_DEVICE:
        return "cuda" if torch.cuda.is_available() else "cpu"
    parsed = torch.device(check_device_name(device))
    if parsed.type != "cuda":
        return device
    if not torch.cuda.is_available():
        if torch.version.cuda is None:
            reason = "this torch build has no CUDA support (torch.version.cuda is None)"
        else:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            reason = "no CUDA device is available (torch.cuda.is_available() is False" + (
                f", CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ")")
        raise DeviceUnavailableError(device, reason, field=field, where=where)
    count = torch.cuda.device_count()
    if parsed.index is not None and parsed.index >= count:
        raise DeviceUnavailableError(device, f"only {count} CUDA device(s) are visible", field=field, where=where)
    return device


def default_runs_dir() -> str:
    return os.environ.get("NIPFLOW_RUNS_DIR", "./runs")


#: Environment variable naming the data directory (generated datasets, the API server's files).
DATA_DIR_ENV = "NIPFLOW_DATA_DIR"


def default_data_dir() -> str:
    """Where generated datasets are cached when nothing else is given.

    ``$NIPFLOW_DATA_DIR`` if set, else the user cache: ``$XDG_CACHE_HOME/nipflow/data``
    (``~/.cache/nipflow/data`` without ``XDG_CACHE_HOME``). The default does not depend
    on the working directory, so runs started anywhere share one cache.
    """
    explicit = os.environ.get(DATA_DIR_ENV)
    if explicit:
        return explicit
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return str(Path(cache) / "nipflow" / "data")


class ExperimentSettings(BaseModel):
    """Options of one execution of an experiment.

    Nothing here may change a training result; everything that can belongs in
    ``HyperParameters``. Secrets are ``SecretStr`` and never serialised.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    run_id: str | None = None
    runs_dir: str = Field(default_factory=default_runs_dir)
    data_dir: str = Field(default_factory=default_data_dir)
    device: str = Field(AUTO_DEVICE, description=DEVICE_DESCRIPTION)
    on_params_mismatch: ParamsMismatchPolicy = "refuse"
    checkpoint_every: int = Field(10, ge=0, description="TensorDict trainers: also checkpoint every N iterations (0: only at the end of a range)")
    show_progress: bool | None = Field(None, description="None: only when stderr is a TTY")
    profile_iterations: str | None = Field(
        None, pattern=r"^\d+:\d+$", description="TensorDict trainers: 'START:STOP' iterations to record with "
                                                   "torch.profiler (Chrome trace in the run store's profiles/)")
    use_wandb: bool = True
    wandb_project: str | None = None
    wandb_mode: Literal["offline", "online", "disabled"] | None = None
    # pure-text / API
    openai_base_url: str | None = None
    openai_api_key: SecretStr | None = Field(None, exclude=True, repr=False)
    max_concurrent_requests: int = Field(16, gt=0)
    api_request_timeout_s: float = Field(
        600.0, gt=0, description="Seconds the text agents' API client waits for one response before it "
                                 "retries (OpenAI's SDK default; a local CPU model answering a whole "
                                 "batch of rollouts can take minutes)")
    fine_tune_poll_interval_s: float = Field(5.0, gt=0)
    fine_tune_poll_max_interval_s: float = Field(60.0, gt=0)
    fine_tune_wait_timeout_s: float | None = Field(None, gt=0)
    local_api_server_dir: str | None = None
    num_rollout_workers: int = Field(
        0, ge=0, description="TensorDict RL trainers: collect the training batches in this many worker "
                             "processes (0: in the trainer's process; CPU only; must divide "
                             "rl.collection_shards). The workers only distribute the shards of "
                             "rl.collection_shards: results are bit-identical for every worker count, and a "
                             "run may be resumed with another one (nip_core/trainers/collectors.py)")
    test_run: bool = Field(
        False, description="nip's smoke run (docs/behaviour.md#b46): the run's whole code path with "
                           "nothing persisted (no run store, checkpoints, rollout files or W&B), one "
                           "minibatch step per iteration and 10 normalisation steps; for checking a new "
                           "configuration or trainer end to end in seconds, never for results")

    @field_validator("device")
    @classmethod
    def _device_name(cls, value: str) -> str:
        return check_device_name(value)

    def run_dir(self) -> Path:
        return Path(self.runs_dir) / (self.run_id or "")

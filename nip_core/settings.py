"""``ExperimentSettings``: run-time options that do not change results (not hashed)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr

ParamsMismatchPolicy = Literal["refuse", "warn", "force"]


def default_runs_dir() -> str:
    return os.environ.get("NIPFLOW_RUNS_DIR", "./runs")


def default_data_dir() -> str:
    return os.environ.get("NIPFLOW_DATA_DIR", "./data")


class ExperimentSettings(BaseModel):
    """Options of one execution of an experiment.

    Nothing here may change a training result; everything that can belongs in
    ``HyperParameters``. Secrets are ``SecretStr`` and never serialised.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    run_id: str | None = None
    runs_dir: str = Field(default_factory=default_runs_dir)
    data_dir: str = Field(default_factory=default_data_dir)
    device: str = "cpu"
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
    fine_tune_poll_interval_s: float = Field(5.0, gt=0)
    fine_tune_poll_max_interval_s: float = Field(60.0, gt=0)
    fine_tune_wait_timeout_s: float | None = Field(None, gt=0)
    local_api_server_dir: str | None = None
    num_rollout_workers: int = Field(0, ge=0)
    test_run: bool = False

    def run_dir(self) -> Path:
        return Path(self.runs_dir) / (self.run_id or "")

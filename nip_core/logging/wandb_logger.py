"""Weights & Biases logging that follows a run across processes and resumes.

* Offline unless the user configured W&B (``WANDB_MODE``, ``settings.wandb_mode``, or an
  API key in ``WANDB_API_KEY``), so no run ever needs a network.
* The W&B run id is stored in the run store's ``metadata.json``; a resumed run — in a new
  process or on another worker — continues the same W&B run (``resume="allow"``).
* The config is the hyper-parameters only (settings, where secrets live, are never sent).
* Steps already logged (``metadata.wandb_last_step``) are skipped on resume, so W&B never
  sees a duplicated or out-of-order step.
"""

from __future__ import annotations

import logging
import os
import secrets
from pathlib import Path
from typing import Any

from nip_core.logging.stat_logger import StatLogger, _jsonable

log = logging.getLogger(__name__)


def resolve_wandb_mode(setting: str | None) -> str:
    if setting:
        return setting
    env = os.environ.get("WANDB_MODE")
    if env in ("offline", "online", "disabled", "dryrun"):
        return "offline" if env == "dryrun" else env
    return "online" if os.environ.get("WANDB_API_KEY") else "offline"


class WandbStatLogger(StatLogger):
    """Logs per-iteration stats and artifacts of one nipflow run to one W&B run."""

    def __init__(self, wandb_run, run, last_step: int | None):
        self.wandb_run = wandb_run
        self.run = run
        self.last_step = last_step

    @classmethod
    def for_run(cls, hyper_params, settings, run) -> "WandbStatLogger":
        import wandb

        meta = run.metadata()
        wandb_id = meta.get("wandb_run_id") or f"{secrets.token_hex(4)}"
        mode = resolve_wandb_mode(settings.wandb_mode)
        wandb_dir = meta.get("wandb_dir")
        if not wandb_dir or not os.path.isdir(wandb_dir):
            wandb_dir = run.storage.full("") if run.storage.local else str(Path("wandb-runs").absolute())
        os.makedirs(wandb_dir, exist_ok=True)
        project = settings.wandb_project or os.environ.get("WANDB_PROJECT") or "nipflow"
        wandb_run = wandb.init(
            project=project,
            id=wandb_id,
            name=run.run_id,
            dir=wandb_dir,
            mode=mode,
            resume="allow",
            config=hyper_params.to_dict(),
            tags=[hyper_params.scenario, hyper_params.trainer, hyper_params.interaction_protocol],
            reinit="create_new",
            settings=wandb.Settings(silent=True, console="off", x_disable_stats=True,
                                    save_code=False),
        )
        run.update_metadata(wandb_run_id=wandb_id, wandb_dir=wandb_dir, wandb_project=project,
                            wandb_mode=mode)
        return cls(wandb_run, run, meta.get("wandb_last_step"))

    def log(self, stats: dict[str, Any], step: int | None = None, kind: str = "train") -> None:
        clean = {k: _jsonable(v) for k, v in stats.items()}
        if step is None:
            self.wandb_run.summary.update(clean)
            return
        if self.last_step is not None and step <= self.last_step:
            if kind == "train":
                return  # already logged before a resume
            self.wandb_run.summary.update(clean)
            return
        self.wandb_run.log(clean, step=step)
        if kind == "train":
            self.last_step = step
            self.run.update_metadata(wandb_last_step=step)

    def log_artifact(self, name: str, artifact_type: str, paths: list[str]) -> None:
        import wandb

        artifact = wandb.Artifact(name, type=artifact_type)
        for path in paths:
            artifact.add_file(path)
        self.wandb_run.log_artifact(artifact)

    def close(self) -> None:
        self.wandb_run.finish()

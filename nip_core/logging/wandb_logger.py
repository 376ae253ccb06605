"""Weights & Biases logging that follows a run across processes and resumes.

* Offline unless the user configured W&B (``WANDB_MODE``, ``settings.wandb_mode``, or an
  API key in ``WANDB_API_KEY``), so no run ever needs a network.
* The W&B run id is stored in the run store's ``metadata.json``; a resumed run — in a new
  process or on another worker — continues the same W&B run (``resume="allow"``).
* The config is the hyper-parameters only (settings, where secrets live, are never sent).
* Steps already logged (``metadata.wandb_last_step``) are skipped on resume, so W&B never
  sees a duplicated or out-of-order step.
* The W&B directory is the one the run used before, else ``$WANDB_DIR``, else the run
  store entry itself.
* Artifacts keep the run store's layout (entry ``checkpoints/iter_000002.pt``). Each
  ``checkpoint`` version is followed by a ``state`` version, and each ``state`` version
  holds :data:`STATE_BUNDLE` and the small JSON records (:data:`RECORD_DIRS`): together
  they are what ``nipflow resume --from-wandb`` needs to rebuild a lost run store entry
  (:mod:`nip_core.wandb_restore`).
* Offline, W&B stages artifact files outside the run directory (a per-user staging area
  that ``wandb sync`` empties), so every file logged as an artifact is also kept under
  ``files/nipflow_run_store/`` of the offline run directory (``--wandb-dir``).
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import uuid
from pathlib import Path
from typing import Any

from nip_core.logging.stat_logger import StatLogger, _jsonable

log = logging.getLogger(__name__)

#: where, under an offline W&B run's ``files/`` directory, logged run-store files are kept
MIRROR_DIR = "nipflow_run_store"
#: run-store files every ``state`` artifact version holds (those that exist)
STATE_BUNDLE = ("state.json", "hyper_params.json", "metadata.json", "metrics.jsonl")
#: run-store directories of small JSON records also put into every ``state`` version
RECORD_DIRS = ("fine_tune", "models", "stages")
#: how long ``close()`` waits for W&B to write the run file out after ``finish()``
FINISH_WRITE_TIMEOUT_S = 60.0


def resolve_wandb_mode(setting: str | None) -> str:
    if setting:
        return setting
    env = os.environ.get("WANDB_MODE")
    if env in ("offline", "online", "disabled", "dryrun"):
        return "offline" if env == "dryrun" else env
    return "online" if os.environ.get("WANDB_API_KEY") else "offline"


class WandbStatLogger(StatLogger):
    """Logs per-iteration stats and artifacts of one nipflow run to one W&B run."""

    def __init__(self, wandb_run, run, last_step: int | None, *, mirror: bool = False):
        self.wandb_run = wandb_run
        self.run = run
        self.last_step = last_step
        self.mirror = mirror

    @classmethod
    def for_run(cls, hyper_params, settings, run) -> "WandbStatLogger":
        import wandb

        meta = run.metadata()
        wandb_id = meta.get("wandb_run_id") or f"{secrets.token_hex(4)}"
        mode = resolve_wandb_mode(settings.wandb_mode)
        wandb_dir = meta.get("wandb_dir")
        if not wandb_dir or not os.path.isdir(wandb_dir):
            wandb_dir = os.environ.get("WANDB_DIR") or (
                run.storage.full("") if run.storage.local else str(Path("wandb-runs").absolute()))
            wandb_dir = str(Path(wandb_dir).absolute())
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
        return cls(wandb_run, run, meta.get("wandb_last_step"), mirror=mode == "offline")

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
        """Log ``paths`` (files of this run's store) as a new version of ``name``.

        A ``state`` version gets the rest of the run's state bundle; a ``checkpoint``
        version is followed by a ``state`` version (``state_{run_id}``).
        """
        with _Staging(self.run) as staging:
            entries = {self._run_relative(path): path for path in paths}
            if artifact_type == "state":
                entries.update({rel: staging.path(rel) for rel in self._state_bundle() if rel not in entries})
            self._log(name, artifact_type, entries)
            if artifact_type == "checkpoint":
                self._log(f"state_{self.run.run_id}", "state",
                          {rel: staging.path(rel) for rel in self._state_bundle()})

    def _log(self, name: str, artifact_type: str, entries: dict[str, str]) -> None:
        import wandb

        artifact = wandb.Artifact(name, type=artifact_type)
        for rel, path in sorted(entries.items()):
            artifact.add_file(path, name=rel)
        self.wandb_run.log_artifact(artifact)
        if self.mirror:
            for rel, path in entries.items():
                _copy_atomically(path, os.path.join(self.wandb_run.dir, MIRROR_DIR, *rel.split("/")))

    def _run_relative(self, path: str) -> str:
        """The run-store path of a logged file.

        A file of a local run store is named by its place in it; a file of a remote one
        was staged by ``Trainer.log_run_artifact`` under its path with ``/`` as ``__``.
        """
        storage = self.run.storage
        if storage.local:
            rel = os.path.relpath(os.path.abspath(path), storage.full(""))
            if not rel.startswith(os.pardir):
                return rel.replace(os.sep, "/")
        return os.path.basename(path).replace("__", "/")

    def _state_bundle(self) -> list[str]:
        rels = [rel for rel in STATE_BUNDLE if self.run.exists(rel)]
        for directory in RECORD_DIRS:
            rels += [f"{directory}/{n}" for n in self.run.list_files(directory) if n.endswith(".json")]
        return rels

    def close(self) -> None:
        """Finish the W&B run and wait until its run file is written out (see
        :func:`nip_core.logging.wandb_reader.wait_until_complete`)."""
        from nip_core.logging.wandb_reader import wait_until_complete

        run_file = self.wandb_run.settings.sync_file
        self.wandb_run.finish()
        if not wait_until_complete(run_file, FINISH_WRITE_TIMEOUT_S):
            log.warning("W&B has not finished writing %s after %.0f s; it may still be incomplete",
                        run_file, FINISH_WRITE_TIMEOUT_S)


class _Staging:
    """Local paths of run-store files: the files themselves, or copies of remote ones.

    Copies are taken at once (a snapshot), so a later write to the store cannot change
    what is logged.
    """

    def __init__(self, run):
        self.run = run
        self._tmp = None

    def __enter__(self) -> "_Staging":
        return self

    def path(self, rel: str) -> str:
        import tempfile

        if self._tmp is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="nipflow-wandb-")
        path = os.path.join(self._tmp.name, *rel.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:  # a mutable file: its current version, under its plain name
            f.write(self.run.storage.read_bytes(self.run.stored_name(rel) or rel))
        return path

    def __exit__(self, *exc) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()


def _copy_atomically(src: str, dst: str) -> None:
    """Make ``dst`` a copy of ``src`` (a hard link where possible: store files are replaced, never
    rewritten in place, except appended ``metrics.jsonl``, which only grows)."""
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    tmp = f"{dst}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copyfile(src, tmp)
    os.replace(tmp, dst)

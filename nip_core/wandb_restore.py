"""Rebuild a lost run store entry from what its W&B run logged.

``nipflow resume RUN_ID --from-wandb [ENTITY/PROJECT/WANDB_ID]`` reads the run's artifacts
through the W&B API; ``nipflow resume RUN_ID --wandb-dir PATH`` reads an offline W&B run
directory (``wandb/offline-run-...``), or a directory holding several (all those of the
run's latest incarnation are merged, oldest first). What they hold is written by
:class:`nip_core.logging.wandb_logger.WandbStatLogger`:

* artifact entries carry their run-store path (``checkpoints/iter_000002.pt``); entries of
  artifacts logged before that (bare file names) are placed by artifact type;
* every ``state`` version holds ``state.json``, ``hyper_params.json``, ``metadata.json``
  (with the run's *incarnation*), ``metrics.jsonl`` and the small JSON records, and one
  follows every ``checkpoint`` version;
* offline, W&B keeps artifact files in a per-user staging area outside the run directory
  (emptied by ``wandb sync``), so the logger also keeps every logged file under
  ``files/nipflow_run_store/`` of the offline run directory: that copy is what is read.

The entry is rebuilt only after everything is checked (parameters, metadata, state, every
checkpoint against its sha256 manifest and parameters hash), and never over an existing
entry. The incarnation is kept, so fine-tune jobs the run created before are adopted, not
created again; the W&B run id is kept, so the resumed run goes on logging to the same run.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Iterable

from nip_core.errors import NipflowError
from nip_core.logging.wandb_logger import MIRROR_DIR
from nip_core.parameters import HyperParameters
from nip_core.runs.store import METADATA_FILE, PARAMS_FILE, STATE_FILE, RunStore, json_record_bytes
from nip_core.utils.fileio import file_sha256

log = logging.getLogger(__name__)

#: artifact types that hold run-store files, and where their bare-named entries belong
ARTIFACT_DIRS = {"state": "", "checkpoint": "checkpoints", "full_rollouts": "rollouts",
                 "raw_transcript": "transcripts"}
_RUN_DIR = re.compile(r"^(offline-)?run-(\d{8}_\d{6})-([A-Za-z0-9]+)$")
_VERSION = re.compile(r"^v(\d+)$")


class WandbRestoreError(NipflowError):
    """The run cannot be rebuilt from W&B; the message names the file, directory or run."""


@dataclass
class RestoredRun:
    """What :func:`write_restored_run` rebuilt."""

    run_id: str
    location: str
    source: str
    incarnation: str
    iteration: int | None
    checkpoints: list[str] = field(default_factory=list)
    num_files: int = 0

    def describe(self) -> str:
        at = "no state" if self.iteration is None else f"state at iteration {self.iteration}"
        return (f"restored run {self.run_id} from {self.source} into {self.location}: {at}, "
                f"{len(self.checkpoints)} checkpoint(s), {self.num_files} file(s), "
                f"incarnation {self.incarnation}")


# -- offline run directories ------------------------------------------------------------------


def _mirror_of(directory: str) -> str:
    return os.path.join(directory, "files", MIRROR_DIR)


def _files_under(root: str) -> dict[str, str]:
    out = {}
    for base, _dirs, names in os.walk(root):
        for name in names:
            if ".tmp-" in name:  # a copy the logger had not finished
                continue
            path = os.path.join(base, name)
            out[os.path.relpath(path, root).replace(os.sep, "/")] = path
    return out


def _read_json(path: str, what: str) -> Any:
    try:
        with open(path, "rb") as f:
            return json.loads(f.read())
    except OSError as e:
        raise WandbRestoreError(f"cannot read {what} {path}: {e.strerror}") from None
    except ValueError as e:
        raise WandbRestoreError(f"{what} {path} is not valid JSON ({e})") from None


def offline_run_files(path: str, run_id: str) -> tuple[dict[str, str], str]:
    """``(files, source)``: the run-store files kept in an offline W&B directory.

    Parameters
    ----------
    path
        An offline run directory (``.../wandb/offline-run-<time>-<id>``), or a directory
        holding such directories at any depth (``.../wandb`` or the directory given as
        ``WANDB_DIR``): those of ``run_id``'s latest incarnation are merged, oldest first.
    run_id
        The nipflow run id.

    Raises
    ------
    WandbRestoreError
        If ``path`` is no such directory, or holds nothing of ``run_id``.
    """
    path = os.path.abspath(path)
    if not os.path.isdir(path):
        raise WandbRestoreError(f"--wandb-dir {path}: not a directory")
    if os.path.isdir(_mirror_of(path)):
        candidates = [path]
    else:
        candidates = sorted((os.path.join(base, d) for base, dirs, _ in os.walk(path) for d in dirs
                             if _RUN_DIR.match(d) and os.path.isdir(_mirror_of(os.path.join(base, d)))),
                            key=lambda d: _RUN_DIR.match(os.path.basename(d)).group(2))
        if not candidates:
            raise WandbRestoreError(
                f"--wandb-dir {path}: no W&B run directory with files/{MIRROR_DIR}/ in it (runs logged "
                "before nipflow kept its files there, or with W&B off, cannot be restored from disk)")
    runs = []  # (directory, incarnation) of run_id, oldest first
    for directory in candidates:
        meta_path = os.path.join(_mirror_of(directory), METADATA_FILE)
        if not os.path.exists(meta_path):
            continue
        meta = _read_json(meta_path, "run metadata")
        if meta.get("run_id") == run_id:
            runs.append((directory, meta.get("incarnation")))
        elif len(candidates) == 1:
            raise WandbRestoreError(f"--wandb-dir {path} holds run {meta.get('run_id')!r}, not {run_id!r}")
    if not runs:
        raise WandbRestoreError(f"--wandb-dir {path}: no W&B run of nipflow run {run_id!r} "
                                f"(no files/{MIRROR_DIR}/{METADATA_FILE} naming it)")
    latest = runs[-1][1]
    files: dict[str, str] = {}
    for directory, incarnation in runs:
        if incarnation == latest:
            files.update(_files_under(_mirror_of(directory)))
    used = [d for d, i in runs if i == latest]
    return files, path if len(used) == 1 and used[0] == path else f"{path} ({len(used)} W&B run dir(s))"


def restore_from_offline_dir(store: RunStore, run_id: str, path: str) -> RestoredRun:
    """Rebuild ``run_id`` in ``store`` from an offline W&B directory (see :func:`offline_run_files`)."""
    files, source = offline_run_files(path, run_id)
    return write_restored_run(store, run_id, files, source)


# -- the W&B API ------------------------------------------------------------------------------


def _version_number(artifact) -> int:
    version = getattr(artifact, "version", None) or artifact.name.rpartition(":")[2]
    match = _VERSION.match(str(version))
    return int(match.group(1)) if match else -1


def artifact_files(artifacts: Iterable[Any], root: str) -> dict[str, str]:
    """Download the run-store files of a W&B run's logged artifacts under ``root``.

    Only the newest ``state`` version is read (each holds the whole state bundle); every
    version of the other restorable types is, oldest first, so that a path logged twice
    ends with its newest bytes. Other artifact types are ignored.

    Parameters
    ----------
    artifacts
        Objects with ``name`` (``"checkpoint_gi-1:v3"``), ``type``, ``version`` and
        ``download(root=...)`` (``wandb`` public-API artifacts).
    root
        A scratch directory.
    """
    chosen: list[tuple[str, int, Any]] = []
    newest_state = None
    for artifact in artifacts:
        if artifact.type not in ARTIFACT_DIRS:
            continue
        number = _version_number(artifact)
        collection = artifact.name.rpartition(":")[0] or artifact.name
        if artifact.type == "state":
            if newest_state is None or number > newest_state[1]:
                newest_state = (collection, number, artifact)
        else:
            chosen.append((collection, number, artifact))
    chosen.sort(key=lambda item: (item[0], item[1]))
    if newest_state is not None:
        chosen.append(newest_state)
    files: dict[str, str] = {}
    for index, (_collection, _number, artifact) in enumerate(chosen):
        target = os.path.join(root, f"{index:06d}")
        downloaded = artifact.download(root=target) or target
        prefix = ARTIFACT_DIRS[artifact.type]
        for rel, local in _files_under(str(downloaded)).items():
            if "/" not in rel and prefix:  # a bare file name: logged before entries kept their path
                rel = f"{prefix}/{rel}"
            files[rel] = local
    return files


def find_wandb_run(api, run_id: str, wandb_path: str | None, project: str):
    """The W&B run of ``run_id``: ``wandb_path`` (``ENTITY/PROJECT/ID``), else the run named
    ``run_id`` in ``project`` (the newest one if there are several)."""
    if wandb_path:
        try:
            return api.run(wandb_path)
        except Exception as e:  # wandb raises its own error types, also for a bad path
            raise WandbRestoreError(f"cannot read W&B run {wandb_path!r}: {e}") from None
    try:
        runs = list(api.runs(project, filters={"display_name": run_id}, order="-created_at"))
    except Exception as e:
        raise WandbRestoreError(f"cannot list the W&B runs of project {project!r}: {e}") from None
    if not runs:
        raise WandbRestoreError(f"no W&B run named {run_id!r} in project {project!r}: give its path "
                                "(--from-wandb ENTITY/PROJECT/RUN_ID)")
    return runs[0]


def restore_from_wandb(store: RunStore, run_id: str, wandb_path: str | None = None, *,
                       project: str = "nipflow", api=None) -> RestoredRun:
    """Rebuild ``run_id`` in ``store`` from the artifacts of its W&B run (online).

    Parameters
    ----------
    store, run_id
        Where to rebuild, and the nipflow run id.
    wandb_path
        ``ENTITY/PROJECT/WANDB_RUN_ID``; by default the run named ``run_id`` in ``project``.
    project
        The W&B project searched when ``wandb_path`` is not given.
    api
        A ``wandb.Api()`` (made here by default; needs W&B credentials and the network).
    """
    if api is None:
        import wandb

        api = wandb.Api()
    wandb_run = find_wandb_run(api, run_id, wandb_path, project)
    source = "W&B run " + "/".join(str(p) for p in getattr(wandb_run, "path", [wandb_path or run_id]))
    with tempfile.TemporaryDirectory(prefix="nipflow-restore-") as tmp:
        try:
            files = artifact_files(wandb_run.logged_artifacts(), tmp)
        except WandbRestoreError:
            raise
        except Exception as e:
            raise WandbRestoreError(f"cannot download the artifacts of {source}: {e}") from None
        return write_restored_run(store, run_id, files, source)


# -- checking and writing ---------------------------------------------------------------------


def check_restored_files(run_id: str, files: dict[str, str], source: str) -> RestoredRun:
    """Check the files of a run before they are written; returns what they hold.

    Checkpoints without a manifest (a copy cut short) are dropped with a warning;
    everything else that does not check out is refused.

    Raises
    ------
    WandbRestoreError
        Naming the file (and ``source``): a missing parameters or metadata file, metadata
        of another run or without an incarnation, a state that does not fit the trainer,
        a checkpoint whose sha256 or parameters hash does not match its manifest, or a
        TensorDict state whose checkpoint is missing.
    ParameterError
        If the parameters are invalid (names the field and the file).
    """
    for required in (PARAMS_FILE, METADATA_FILE):
        if required not in files:
            raise WandbRestoreError(f"{source} holds no {required} of run {run_id!r} (nothing to restore "
                                    "from: was it logged with W&B on, by this version of nipflow?)")
    params = HyperParameters.from_dict(_read_json(files[PARAMS_FILE], "parameters"), source=files[PARAMS_FILE],
                                      stored=True)
    meta = _read_json(files[METADATA_FILE], "run metadata")
    if not isinstance(meta, dict) or not meta.get("incarnation"):
        raise WandbRestoreError(f"{files[METADATA_FILE]}: run metadata without an incarnation")
    if meta.get("run_id", run_id) != run_id:
        raise WandbRestoreError(f"{files[METADATA_FILE]}: metadata of run {meta.get('run_id')!r}, not {run_id!r}")
    from nip_core.parameters.trainer_specs import trainer_kind
    from nip_core.trainers.registry import get_trainer_class

    iteration = None
    if STATE_FILE in files:
        state_cls = get_trainer_class(params.trainer).State
        try:
            state = state_cls.model_validate(_read_json(files[STATE_FILE], "state"))
        except ValueError as e:
            raise WandbRestoreError(f"{files[STATE_FILE]}: does not fit {state_cls.__name__}: {e}") from None
        iteration = int(state.iteration)
    params_hash = params.params_hash()
    checkpoints = []
    for manifest_rel in sorted(files):
        if not (manifest_rel.startswith("checkpoints/") and manifest_rel.endswith(".json")):
            continue
        manifest = _read_json(files[manifest_rel], "checkpoint manifest")
        name = manifest_rel[len("checkpoints/"):-len(".json")]
        data_name = str(manifest.get("data") or f"{name}.pt")  # the data file it names
        if "/" in data_name or not data_name.startswith(f"{name}.") or not data_name.endswith(".pt"):
            raise WandbRestoreError(f"{files[manifest_rel]}: names a data file outside the checkpoint ({data_name!r})")
        rel = f"checkpoints/{data_name}"
        if rel not in files:
            log.warning("%s: no data file %s; this checkpoint is not restored", files[manifest_rel], rel)
            continue
        if file_sha256(files[rel]) != manifest.get("sha256"):
            raise WandbRestoreError(f"{files[rel]}: sha256 does not match its manifest {manifest_rel}")
        if manifest.get("params_hash") not in params.accepted_params_hashes():
            raise WandbRestoreError(f"{files[rel]}: written for params hash {manifest.get('params_hash')}, "
                                    f"the run's parameters have {params_hash}")
        checkpoints.append(name)
    if iteration and trainer_kind(params.trainer) == "tensordict" and f"iter_{iteration:06d}" not in checkpoints:
        raise WandbRestoreError(f"{files[STATE_FILE]}: the state is at iteration {iteration} but {source} holds "
                                f"no checkpoint iter_{iteration:06d}")
    return RestoredRun(run_id=run_id, location="", source=source, incarnation=str(meta["incarnation"]),
                       iteration=iteration, checkpoints=checkpoints)


def write_restored_run(store: RunStore, run_id: str, files: dict[str, str], source: str) -> RestoredRun:
    """Check ``files`` (run-store path -> local file) and write them as the entry of ``run_id``.

    A local entry is written into a temporary sibling directory and renamed into place, so
    an interrupted restore leaves no partial entry; on an object store the parameters file,
    which makes the entry exist, is written last.

    Raises
    ------
    WandbRestoreError
        If the entry exists already (names it), or a file does not check out (see
        :func:`check_restored_files`).
    """
    storage = store.run_storage(run_id)
    if storage.exists(""):
        raise WandbRestoreError(f"run store entry {storage.url()} exists: refusing to restore over it "
                                "(resume it as it is, or move it away first)")
    restored = check_restored_files(run_id, files, source)
    kept = set()  # each restored checkpoint's manifest and the data file it names
    for name in restored.checkpoints:
        manifest = _read_json(files[f"checkpoints/{name}.json"], "checkpoint manifest")
        kept |= {f"checkpoints/{name}.json", f"checkpoints/{manifest.get('data') or name + '.pt'}"}
    wanted = {rel: path for rel, path in files.items() if not rel.startswith("checkpoints/") or rel in kept}
    meta = _read_json(files[METADATA_FILE], "run metadata")
    meta["restored_from"] = {"source": source, "at": datetime.now(timezone.utc).isoformat()}
    meta_bytes = json_record_bytes(meta)
    order = sorted(rel for rel in wanted if rel not in (PARAMS_FILE, METADATA_FILE)) + [METADATA_FILE, PARAMS_FILE]

    if storage.local:
        final = storage.full("")
        os.makedirs(os.path.dirname(final), exist_ok=True)
        tmp = os.path.join(os.path.dirname(final), f".restore-{run_id}-{uuid.uuid4().hex[:8]}")
        try:
            for rel in order:
                target = os.path.join(tmp, *rel.split("/"))
                os.makedirs(os.path.dirname(target), exist_ok=True)
                if rel == METADATA_FILE:
                    with open(target, "wb") as f:
                        f.write(meta_bytes)
                else:
                    shutil.copyfile(wanted[rel], target)
            if os.path.exists(final):
                raise WandbRestoreError(f"run store entry {final} appeared during the restore: not replaced")
            os.rename(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    else:
        for rel in order:
            if rel == METADATA_FILE:
                storage.write_bytes(rel, meta_bytes)
            else:
                with open(wanted[rel], "rb") as f:
                    storage.write_bytes(rel, f.read())
    restored.location = storage.url()
    restored.num_files = len(order)
    log.info("%s", restored.describe())
    return restored

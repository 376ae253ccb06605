"""Warm starts: a new run begins with the final models of an earlier run.

Two halves, both free of any orchestration:

* :func:`prepare_warm_start` (called once, when the new run is created, e.g. by the
  ``scheduled_retraining`` flow) copies into the new run's ``warm_start/`` folder what each
  trainer kind needs from the source run:

  - ``warm_start/<name>.pt`` + ``warm_start/<name>.json``: the source run's *final*
    checkpoint (the one whose manifest has the highest ``iteration``) and its sha256
    manifest, for the TensorDict trainers;
  - ``warm_start/models.json``: the fine-tuned model name of every shared model group in
    the source run's final ``state.json``, for the pure-text trainers;
  - ``warm_start/source.json``: which run, checkpoint and models were copied.

  It also records ``metadata.warm_start_from``. A run that already has a state is left
  alone: a resumed run keeps its own models. Every file there is written once and never
  replaced; ``source.json`` is written first and the first one stands, so a retry (even one
  asked for another source) or a driver that lost its lease copies only what it names.

* The trainers read ``warm_start/`` when their run has no state yet:
  :meth:`nip_core.trainers.tensordict_rl.TensorDictRlTrainer.maybe_warm_start` (through
  :func:`load_warm_start_agents`) and :func:`warm_start_pure_text`. Each records
  ``metadata.warm_started`` (source run, checkpoint or models, sha256) and logs it.

What a warm start carries over (TensorDict trainers): the agents' weights only. The new
run starts at iteration 0 with

* a fresh optimiser (Adam moments and step counts reset): the new run restarts its
  learning-rate schedule (``rl.anneal_lr``) and may have other learning rates or other
  parameter groups, for which stale moments would be wrong or would not even fit;
* its own loss-module state (e.g. the adaptive KL coefficient), observation-normaliser
  statistics, RNG streams and episodes, all derived from its own seed and parameters as in
  a fresh run, so that a warm-started run is reproducible from its parameters plus the
  warm-start checkpoint.

The warm-start checkpoint is verified and read like any checkpoint (sha256 against its
manifest; safetensors + JSON, never unpickled: :mod:`nip_core.trainers.checkpoint_format`),
but not against the new run's params hash, which legitimately differs; instead every
tensor's name and shape must match the new run's agents, and a mismatch is refused with
the tensors named.
"""

from __future__ import annotations

import hashlib
import logging
import posixpath
import re
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from nip_core.errors import CheckpointNotFoundError, CorruptCheckpointError, NipflowError

if TYPE_CHECKING:
    from nip_core.runs import Run

log = logging.getLogger(__name__)

WARM_START_DIR = "warm_start"
SOURCE_FILE = f"{WARM_START_DIR}/source.json"
MODELS_FILE = f"{WARM_START_DIR}/models.json"
_ITER_NAME = re.compile(r"^iter_(\d+)$")


class WarmStartError(NipflowError):
    """A warm start cannot be used: missing source run, or models that do not fit (names them)."""


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


# -- preparing (the run that is being created) ------------------------------------------------


def final_checkpoint(run: "Run") -> str | None:
    """Name of ``run``'s final checkpoint: the highest manifest ``iteration`` (None if none).

    Manifests without an ``iteration`` fall back on the number in an ``iter_NNNNNN`` name;
    ties go to the later name.
    """
    best: tuple[int, str] | None = None
    for name in run.list_checkpoints():
        manifest = run.read_json(f"checkpoints/{name}.json", "checkpoint manifest")
        iteration = manifest.get("iteration")
        if iteration is None:
            match = _ITER_NAME.match(name)
            iteration = int(match.group(1)) if match else -1
        key = (int(iteration), name)
        if best is None or key > best:
            best = key
    return best[1] if best else None


def _final_models(source: "Run") -> dict[str, str | None] | None:
    """``{group: fine_tuned_model_name}`` from the source's ``state.json``; None without groups."""
    if not source.has_state():
        return None
    state = source.read_json("state.json", "state file")
    groups = state.get("shared_model_groups") if isinstance(state, dict) else None
    if not groups:
        return None
    return {name: (g or {}).get("fine_tuned_model_name") for name, g in sorted(groups.items())}


def prepare_warm_start(run: "Run", source: "Run") -> dict[str, Any]:
    """Copy what the trainers need to start from ``source``'s final models into ``run``.

    Parameters
    ----------
    run
        The new run (must have no state yet; otherwise nothing happens).
    source
        The finished run whose final models the new run starts from.

    Returns
    -------
    dict
        The ``metadata.warm_start_from`` record (``run_id``, ``location``, ``checkpoint``,
        ``checkpoints``, ``models``), or ``{}`` when ``run`` already has a state.
    """
    if run.has_state():
        log.info("run %s already has a state: warm start from %s not applied (a resumed run keeps its own)",
                 run.run_id, source.run_id)
        return {}
    checkpoint = final_checkpoint(source)
    intent = {"run_id": source.run_id, "location": source.location, "checkpoint": checkpoint,
              "checkpoints": [checkpoint] if checkpoint else [], "models": _final_models(source),
              "prepared_at": _now()}
    # The record is written first and kept first: a retry, or a driver that was paused and
    # woke after another took the run over, copies what the first record names.
    record = run.write_json_keep_first(SOURCE_FILE, intent, "warm-start record")
    if record["run_id"] != source.run_id or record["location"] != source.location:
        log.warning("run %s was prepared to warm start from run %s (%s): kept, %s not applied",
                    run.run_id, record["run_id"], run.storage.full(SOURCE_FILE), source.run_id)
        source = _recorded_source(record)
    _copy_files(run, source, record)
    run.update_metadata(warm_start_from=record)
    log.info("run %s: warm start prepared from run %s (checkpoint %s, models %s)", run.run_id,
             record["run_id"], record["checkpoint"], record["models"])
    return record


def _recorded_source(record: dict[str, Any]) -> "Run":
    """The source run that ``record`` names (its store is the folder above its location)."""
    from nip_core.runs import RunStore

    return RunStore(posixpath.dirname(record["location"].rstrip("/"))).open_run(record["run_id"])


def _copy_files(run: "Run", source: "Run", record: dict[str, Any]) -> None:
    """Create (write-once) the files ``record`` names in ``run``'s ``warm_start/`` folder.

    Every file is created exclusively and never replaced (:meth:`Run.write_once`): copying
    again writes nothing, and a stale driver cannot change what the trainers read.
    """
    checkpoint = record["checkpoint"]
    if checkpoint is not None:
        # the manifest names its data file (``<name>.pt`` or a content-addressed one); the
        # copy here is always ``<name>.pt`` beside the manifest
        files = ((source.checkpoint_data_rel(checkpoint), ".pt"), (f"checkpoints/{checkpoint}.json", ".json"))
        for rel, suffix in files:
            try:
                data = source.storage.read_bytes(rel)
            except FileNotFoundError:
                raise CheckpointNotFoundError(source.storage.full(rel), "warm-start checkpoint") from None
            run.write_once(f"{WARM_START_DIR}/{checkpoint}{suffix}", data, "warm-start checkpoint")
    if record["models"] is not None:
        run.write_json_once(MODELS_FILE, {"run_id": record["run_id"], "location": record["location"],
                                          "groups": record["models"]}, "warm-start models")


# -- reading (the trainers) -----------------------------------------------------------------


def warm_start_source(run: "Run") -> dict[str, Any] | None:
    """``warm_start/source.json`` of ``run`` (None without one)."""
    if not run.exists(SOURCE_FILE):
        return None
    return run.read_json(SOURCE_FILE, "warm-start record")


def read_warm_start_checkpoint(run: "Run") -> tuple[bytes, dict[str, Any], str] | None:
    """The verified bytes, manifest and path of ``run``'s warm-start checkpoint (None if none).

    Raises
    ------
    CheckpointNotFoundError
        If the record names a checkpoint whose data file is missing.
    CorruptCheckpointError
        If the manifest is not valid JSON or the data's sha256 does not match it.
    """
    source = warm_start_source(run) or {}
    name = source.get("checkpoint")
    if name is None:
        if source:
            return None  # the source run had no checkpoint (e.g. a pure-text run)
        # No record (written by hand or by an older version): the newest manifest there.
        names = [n[:-5] for n in run.storage.listdir(WARM_START_DIR)
                 if n.endswith(".json") and n not in ("source.json", "models.json")]
        if not names:
            return None
        name = max(names, key=lambda n: (int(m.group(1)) if (m := _ITER_NAME.match(n)) else -1, n))
    manifest_rel, data_rel = f"{WARM_START_DIR}/{name}.json", f"{WARM_START_DIR}/{name}.pt"
    manifest = run.read_json(manifest_rel, "warm-start checkpoint manifest")
    if not isinstance(manifest, dict) or "sha256" not in manifest:
        raise CorruptCheckpointError(run.storage.full(manifest_rel), "manifest has no sha256")
    try:
        data = run.storage.read_bytes(data_rel)
    except FileNotFoundError:
        raise CheckpointNotFoundError(run.storage.full(data_rel), "warm-start checkpoint") from None
    if hashlib.sha256(data).hexdigest() != manifest["sha256"]:
        raise CorruptCheckpointError(run.storage.full(data_rel),
                                     f"sha256 does not match its manifest {run.storage.full(manifest_rel)} "
                                     "(warm start refused)")
    return data, manifest, run.storage.full(data_rel)


def check_state_dict_fits(current: dict[str, Any], loaded: dict[str, Any], path: str) -> None:
    """Refuse ``loaded`` unless it has exactly ``current``'s tensor names and shapes.

    Raises
    ------
    WarmStartError
        Naming the file, the differing shapes and the missing/unexpected tensors.
    """
    problems = []
    shapes = [f"{k}: checkpoint {tuple(loaded[k].shape)} vs run {tuple(current[k].shape)}"
              for k in current if k in loaded and hasattr(loaded[k], "shape")
              and tuple(loaded[k].shape) != tuple(current[k].shape)]
    if shapes:
        problems.append("shape mismatch " + "; ".join(shapes[:10]) + (" ..." if len(shapes) > 10 else ""))
    missing = sorted(set(current) - set(loaded))
    unexpected = sorted(set(loaded) - set(current))
    if missing:
        problems.append(f"missing in the checkpoint: {', '.join(missing[:10])}" + (" ..." if len(missing) > 10 else ""))
    if unexpected:
        problems.append(f"not in this run's agents: {', '.join(unexpected[:10])}"
                        + (" ..." if len(unexpected) > 10 else ""))
    if problems:
        raise WarmStartError(f"warm start {path} does not fit this run's agents (different model "
                             f"parameters?): {' | '.join(problems)}")


def load_warm_start_agents(run: "Run", agents: Any) -> dict[str, Any] | None:
    """Load the warm-start checkpoint's agent weights into ``agents`` (a torch module).

    Returns the ``metadata.warm_started`` record written, or None when ``run`` has no
    warm-start checkpoint. Only the ``agents`` entry of the checkpoint is used (see the
    module docstring for what is deliberately not carried over).

    Raises
    ------
    CorruptCheckpointError, CheckpointNotFoundError
        See :func:`read_warm_start_checkpoint`; also when the file is not a checkpoint, and
        (``UnsafeCheckpointError``) when it is an old pickle that cannot be loaded safely.
    WarmStartError
        If the weights' names or shapes do not match ``agents``.
    """
    from nip_core.trainers.checkpoint_files import read_checkpoint

    found = read_warm_start_checkpoint(run)
    if found is None:
        return None
    data, manifest, path = found
    state = read_checkpoint(data, source=path, map_location="cpu")  # never unpickles the file
    if not isinstance(state, dict) or not isinstance(state.get("agents"), dict):
        raise CorruptCheckpointError(path, "has no 'agents' weights (not a TensorDict RL checkpoint)")
    check_state_dict_fits(agents.state_dict(), state["agents"], path)
    agents.load_state_dict(state["agents"])
    source = warm_start_source(run) or {}
    record = {"run_id": source.get("run_id"), "location": source.get("location"),
              "checkpoint": path.rsplit("/", 1)[-1][:-3], "source_iteration": manifest.get("iteration",
                                                                                        state.get("iteration")),
              "sha256": manifest["sha256"], "loaded": "agents", "at": _now()}
    run.update_metadata(warm_started=record)
    log.info("run %s: warm-started the agents from run %s, checkpoint %s (iteration %s, sha256 %s...)",
             run.run_id, record["run_id"], record["checkpoint"], record["source_iteration"], record["sha256"][:12])
    return record


def warm_start_pure_text(trainer: Any) -> dict[str, Any] | None:
    """Start a pure-text trainer's groups from the warm-start models (when the run has no state).

    Call this before the first stage of a new run (``run_stage`` at iteration 0, stage
    ``sample_rollouts``, before the group states are pushed from the trainer state). It sets
    each shared model group's ``fine_tuned_model_name`` to the source run's final one
    (``None`` there means the base model), clears the groups' job records, and saves the
    state at once, so that it runs at most once per run and a resumed run keeps its own.

    Returns the ``metadata.warm_started`` record, or None when nothing was done (no run,
    a state already saved, a rerun-tests run, or no ``warm_start/models.json``).

    Raises
    ------
    CorruptCheckpointError
        If ``warm_start/models.json`` is not valid JSON or has no ``groups`` mapping.
    WarmStartError
        If its groups are not exactly the trainer's groups (names both sides).
    """
    run = trainer.run
    if run.has_state() or getattr(trainer, "rerun_tests", False):  # a NullRun has neither state nor file
        return None
    if not run.exists(MODELS_FILE):
        return None
    record = run.read_json(MODELS_FILE, "warm-start models")
    models = record.get("groups") if isinstance(record, dict) else None
    if not isinstance(models, dict) or not all(v is None or isinstance(v, str) for v in models.values()):
        raise CorruptCheckpointError(run.storage.full(MODELS_FILE), "no 'groups' mapping of group -> model name")
    if set(models) != set(trainer.groups):
        raise WarmStartError(f"warm start {run.storage.full(MODELS_FILE)}: groups {sorted(models)} of run "
                             f"'{record.get('run_id')}' do not match this run's groups {sorted(trainer.groups)}")
    from nip_core.agents.pure_text import PureTextSharedModelGroupState

    for name, group in trainer.groups.items():
        group.state = PureTextSharedModelGroupState(fine_tuned_model_name=models[name])
    trainer.save_state()  # copies the group states into the trainer state and writes state.json
    warm = {"run_id": record.get("run_id"), "location": record.get("location"),
            "models": {n: g.model_name for n, g in trainer.groups.items()}, "at": _now()}
    run.update_metadata(warm_started=warm)
    trainer.logger.info("run %s: warm-started from run %s with models %s", run.run_id, warm["run_id"],
                        warm["models"])
    return warm

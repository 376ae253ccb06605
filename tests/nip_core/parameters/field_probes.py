"""Perturbation probes: does changing one hyper-parameter change what a trainer does?

A probe trains a tiny experiment twice through :func:`nip_core.trainers.build.build_trainer`
(the same path as ``nipflow run --direct``): once on a base configuration and once with one
field changed. What the trainer did is read back as a *fingerprint* of everything the run
left behind that the parameters do not merely echo:

* every file of the run directory, parsed (JSON, JSON lines, YAML) and with its timings,
  clocks and job/file ids taken out; ``hyper_params.json`` and ``metadata.json`` (the
  parameters and the invocations) are left out, and so are manifest entries naming the
  parameters' hash;
* the agents' trained weights (TensorDict and solo trainers).

A field has an effect on a trainer when some probe's fingerprint differs from its base's.
The probe of a field may need a *context* (other fields set first, e.g. ``ppo.kl_target``
only acts with ``ppo.loss_type="kl_penalty"``): :data:`PROBES` gives it, with the value to try
when the automatic choice (:func:`alternative`) does not fit.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import types
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types
import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from nip_core.parameters import HyperParameters

#: Keys dropped from parsed files: clocks, durations, ids handed out by a server, hashes of
#: the parameters (an echo of the input, not something the trainer did).
_NOISE_KEY = re.compile(r"(^|_|\.)(time|times|timestamp|created|created_at|finished_at|started_at|wall|"
                        r"elapsed|duration|seconds|pid|host|hostname|params_hash|hyper_params_hash|"
                        r"job_id|jobs|file_id|id|saved_at)$|_s$|_at$|^t_", re.IGNORECASE)
_NOISE_VALUE = re.compile(r"(ftjob|file|ft|chatcmpl|job)[-:][A-Za-z0-9:_\-.]+|(?<=nipflow-)[0-9a-f]{12}(?=-it)")
_SKIPPED_FILES = {"hyper_params.json", "metadata.json"}


def _clean(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items() if not _NOISE_KEY.search(str(k))}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    if isinstance(value, str):
        return _NOISE_VALUE.sub("<id>", value)
    if isinstance(value, float):
        return round(value, 9)
    return value


def _parsed(path: Path) -> Any:
    text = path.read_text(errors="replace") if path.suffix in (".json", ".jsonl", ".yaml", ".yml", ".txt") else None
    if text is None:
        return hashlib.sha256(path.read_bytes()).hexdigest() if path.suffix != ".pt" else "<tensors>"
    if path.suffix == ".json" and path.parent.name == "checkpoints":
        return _checkpoint_manifest(path, json.loads(text))
    if path.suffix == ".json":
        return _clean(json.loads(text))
    if path.suffix == ".jsonl":
        return [_clean(json.loads(line)) for line in text.splitlines() if line.strip()]
    if path.suffix in (".yaml", ".yml"):
        return _clean(yaml.safe_load(text))
    return _NOISE_VALUE.sub("<id>", text)


def _checkpoint_manifest(path: Path, manifest: dict[str, Any]) -> Any:
    """A checkpoint's manifest with the hash of its bytes replaced by a digest of what the
    trainer owns in it (``tests/run_files.py``: not the process-wide Python and numpy RNG
    states, which other threads of a test process move)."""
    from nip_core.trainers.checkpoint_files import read_checkpoint
    from tests.run_files import state_digest, trainer_owned

    data = path.parent / str(manifest.get("data", ""))
    if "sha256" in manifest and data.is_file():
        state = read_checkpoint(data.read_bytes(), source=str(data))
        if isinstance(state, dict) and isinstance(state.get("rng"), dict) and {"python", "numpy"} <= set(state["rng"]):
            manifest = {**manifest, "sha256": "state:" + state_digest(trainer_owned(state))}
    return _clean(manifest)


def run_dir_fingerprint(run_dir: Path) -> dict[str, Any]:
    """``{relative path: cleaned content}`` of every file the run wrote (leases excepted)."""
    out: dict[str, Any] = {}
    for path in sorted(run_dir.rglob("*")):
        rel = path.relative_to(run_dir).as_posix()
        if path.is_file() and path.name not in _SKIPPED_FILES and not rel.startswith("leases/"):
            out[rel] = _parsed(path)
    return out


def tensor_digest(state: dict[str, Any]) -> dict[str, str]:
    """A digest per entry of a state dict (dtype, shape and bytes)."""
    import torch

    out = {}
    for key, value in state.items():
        if isinstance(value, torch.Tensor):
            t = value.detach().cpu().contiguous()
            raw = t.view(torch.uint8) if t.dtype != torch.bool else t.to(torch.uint8)
            out[key] = f"{t.dtype}{tuple(t.shape)}:{hashlib.sha256(raw.numpy().tobytes()).hexdigest()[:16]}"
    return out


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Where two fingerprints differ (paths, at most a few levels deep, for messages)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b), key=str):
            if key not in a or key not in b:
                out.append(f"{path}{key}")
            else:
                out.extend(differences(a[key], b[key], f"{path}{key}/"))
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}{i}/")]
    return [] if a == b else [path.rstrip("/") or "<root>"]


# --- the values to try -----------------------------------------------------------------


def _bounds(info: FieldInfo) -> dict[str, float]:
    out: dict[str, float] = {}
    for meta in info.metadata:
        for name in ("gt", "ge", "lt", "le"):
            if isinstance(meta, getattr(annotated_types, name.capitalize())):
                out[name] = getattr(meta, name)
    return out


def _core(annotation: Any) -> list[Any]:
    """The non-None members of a (possibly optional) annotation, ``Annotated`` members unwrapped."""
    origin = get_origin(annotation)
    members = get_args(annotation) if origin in (Union, types.UnionType) else (annotation,)
    return [get_args(a)[0] if get_origin(a) is Annotated else a for a in members if a is not type(None)]


def alternative(info: FieldInfo, default: Any) -> Any:
    """A valid value other than ``default`` for a plain field, or raise ``LookupError``."""
    members = _core(info.annotation)
    bounds = _bounds(info)
    for member in members:
        if get_origin(member) is Literal:
            others = [c for c in get_args(member) if c != default]
            if others:
                return others[0]
        if member is bool:
            return not default if isinstance(default, bool) else True
        if member is int:
            base = default if isinstance(default, int) and not isinstance(default, bool) else 1
            candidate = base + 1
            if ("le" in bounds and candidate > bounds["le"]) or ("lt" in bounds and candidate >= bounds["lt"]):
                candidate = base - 1
            return candidate
        if member is float:
            base = float(default) if isinstance(default, (int, float)) and not isinstance(default, bool) else 0.5
            candidate = base * 0.5 if base else 0.25
            if ("le" in bounds and candidate > bounds["le"]) or ("lt" in bounds and candidate >= bounds["lt"]):
                candidate = base * 0.5
            return candidate
    raise LookupError(f"no automatic alternative for {info.annotation!r}")


def set_path(config: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A deep copy of ``config`` with the dotted ``path`` set (missing groups created)."""
    out = copy.deepcopy(config)
    node = out
    parts = path.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return out


def field_info(path: str) -> tuple[FieldInfo, Any]:
    """The ``FieldInfo`` and default of a dotted ``HyperParameters`` path (not an agent's)."""
    model: type[BaseModel] = HyperParameters
    parts = path.split(".")
    info = None
    i = 0
    while i < len(parts):
        part = parts[i]
        if model is HyperParameters and part == "agents":
            raise LookupError("use agent_field_info for agent fields")
        info = model.model_fields[part]
        sub = [m for m in _core(info.annotation) if isinstance(m, type) and issubclass(m, BaseModel)]
        if sub and i < len(parts) - 1:
            model = sub[0]
        i += 1
    assert info is not None
    return info, info.get_default(call_default_factory=True)


def agent_field_info(scenario: str, path: str) -> tuple[FieldInfo, Any]:
    """``FieldInfo`` and default of ``agents.<name>.<field>[.<sub>]`` for the scenario's agent class."""
    from nip_core.parameters.agents import AGENT_PARAMS_BY_SCENARIO

    model: type[BaseModel] = AGENT_PARAMS_BY_SCENARIO[scenario]
    parts = path.split(".")[2:]
    info = None
    for i, part in enumerate(parts):
        info = model.model_fields[part]
        sub = [m for m in _core(info.annotation) if isinstance(m, type) and issubclass(m, BaseModel)]
        if sub and i < len(parts) - 1:
            model = sub[0]
    assert info is not None
    return info, info.get_default(call_default_factory=True)


# --- running a probe ---------------------------------------------------------------------


#: Files an uninterrupted text run writes once and never rewrites (rollouts, transcripts and
#: model records are even created exclusively; a stage summary is written when its stage ends):
#: once such a file of a perturbed run differs from the finished base run's, the runs differ.
_WRITTEN_ONCE = re.compile(r"^(rollouts|stages|transcripts|models)/")


def first_difference(partial: dict[str, Any], finished: dict[str, Any]) -> str | None:
    """A written-once file of a run in progress that the finished ``finished`` run does not have as is."""
    for rel, content in partial.items():
        if _WRITTEN_ONCE.match(rel) and (rel not in finished or finished[rel] != content):
            return rel
    return None


def fingerprint(config: dict[str, Any], workdir: Path, *, data_dir: Path, api_url: str | None = None,
                reference: dict[str, Any] | None = None) -> dict[str, Any]:
    """Train ``config`` in ``workdir`` and return what the trainer did (see the module's text).

    Text trainers talk to the OpenAI-compatible server at ``api_url`` (the local server's
    stand-in model: seeded sampling, fine-tunes that repeat exactly) and run stage by stage,
    as ``train()`` does; given the ``reference`` fingerprint of a finished run, a text run
    stops after the first stage whose written-once files differ from it (``stopped_at``
    names the file), which is enough to tell the two apart.
    """
    import torch

    from nip_core.settings import ExperimentSettings
    from nip_core.trainers.build import build_trainer

    hp = HyperParameters.model_validate(config)
    text = {} if api_url is None else dict(openai_base_url=api_url, fine_tune_poll_interval_s=0.02,
                                            fine_tune_poll_max_interval_s=0.05, max_concurrent_requests=8)
    settings = ExperimentSettings(use_wandb=False, runs_dir=str(workdir / "runs"), data_dir=str(data_dir),
                                  run_id="probe", show_progress=False, **text)
    torch.set_num_threads(1)
    trainer = build_trainer(hp, settings)
    run_dir = workdir / "runs" / "probe"
    if reference is not None and api_url is not None:
        from nip_core.trainers.stage_machine import Stage

        while trainer.next_stage().stage is not Stage.DONE:
            trainer.run_stage(trainer.next_stage().stage)
            partial = run_dir_fingerprint(run_dir)
            differing = first_difference(partial, reference["run"])
            if differing is not None:
                return {"run": partial, "stopped_at": differing}
    else:
        trainer.train()
    out: dict[str, Any] = {"run": run_dir_fingerprint(run_dir)}
    agents = getattr(trainer, "agents", None)
    if isinstance(agents, torch.nn.Module):
        out["weights"] = tensor_digest(agents.state_dict())
    return out

"""Rebuilding a lost run store entry from its W&B run (issue #18, point 9b).

The fast tests build offline run directories and API artifacts by hand, in the layout
``WandbStatLogger`` writes; the slow ones log real offline W&B runs in subprocesses.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from flows.cli import main
from nip_core.logging.wandb_logger import MIRROR_DIR
from nip_core.logging.wandb_reader import read_offline_runs
from nip_core.parameters import HyperParameters
from nip_core.parameters.agents import GraphIsomorphismAgentParameters
from nip_core.runs import RunStore
from nip_core.wandb_restore import (
    WandbRestoreError,
    artifact_files,
    restore_from_offline_dir,
    restore_from_wandb,
)
from nip_core.trainers.checkpoint_files import read_checkpoint
from nip_core.trainers.registry import get_trainer_class

REPO = Path(__file__).resolve().parents[3]
TINY = GraphIsomorphismAgentParameters.construct_test_params().model_dump(mode="json")
GI = {"scenario": "graph_isomorphism", "trainer": "vanilla_ppo", "dataset": "test", "d_representation": 2,
      "agents": {"_default": TINY},
      "rl": {"frames_per_batch": 16, "num_iterations": 4, "num_epochs": 1, "minibatch_size": 8,
             "num_test_iterations": 1, "num_normalization_steps": 3}}


def make_source_run(runs_dir: Path, run_id="r", iterations=(2,), state_iteration=2) -> Path:
    """A run store entry as a stopped GI run leaves it (without W&B)."""
    run = RunStore(str(runs_dir)).open_run(run_id, HyperParameters.from_dict(GI))
    for i in iterations:
        run.save_checkpoint_bytes(f"iter_{i:06d}", f"weights of {i}".encode() * 100, iteration=i)
    run.save_state(get_trainer_class("vanilla_ppo").State(iteration=state_iteration))
    run.append_metrics(0, {"mean_accuracy": 0.5})
    return runs_dir / run_id


def as_offline_dir(run_dir: Path, wandb_dir: Path, stamp="20260101_000000", wandb_id="abcd1234") -> Path:
    """Copy a run store entry where an offline W&B run keeps it."""
    target = wandb_dir / f"offline-run-{stamp}-{wandb_id}"
    shutil.copytree(run_dir, target / "files" / MIRROR_DIR, ignore=shutil.ignore_patterns("leases"))
    return target


def tree(root: Path, exclude=("metadata.json",)) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name not in exclude and "leases" not in p.parts}


def test_offline_dir_restores_params_state_checkpoints_and_incarnation_byte_for_byte(tmp_path):
    source = make_source_run(tmp_path / "old", iterations=(1, 2))
    offline = as_offline_dir(source, tmp_path / "wandb")
    expected, meta = tree(source), json.loads((source / "metadata.json").read_text())
    store = RunStore(str(tmp_path / "runs"))

    restored = restore_from_offline_dir(store, "r", str(offline))

    entry = tmp_path / "runs" / "r"
    assert tree(entry) == expected and len(expected) == 7  # params, state, metrics, 2 x (pt + manifest)
    assert (restored.iteration, restored.checkpoints, restored.incarnation) == (2, ["iter_000001", "iter_000002"],
                                                                                meta["incarnation"])
    run = store.open_run("r")
    assert run.incarnation == meta["incarnation"]
    assert run.metadata()["restored_from"]["source"] == str(offline)
    assert {k: v for k, v in run.metadata().items() if k != "restored_from"} == meta
    assert run.load_checkpoint_bytes("iter_000002")[0] == b"weights of 2" * 100
    assert not [p for p in (tmp_path / "runs").iterdir() if p.name != "r"]  # no temporary directory left


def test_a_checkpoint_whose_data_file_is_content_addressed_is_restored_by_its_manifest(tmp_path):
    """A driver that took over wrote iteration 2 again beside an orphan: its manifest names the data file."""
    runs = tmp_path / "old"
    run = RunStore(str(runs)).open_run("r", HyperParameters.from_dict(GI))
    run.storage.create_exclusive("checkpoints/iter_000002.pt", b"an orphan, no manifest")
    data_rel = run.save_checkpoint_bytes("iter_000002", b"weights of 2", iteration=2)
    assert data_rel != "checkpoints/iter_000002.pt"
    run.save_state(get_trainer_class("vanilla_ppo").State(iteration=2))
    offline = as_offline_dir(runs / "r", tmp_path / "wandb")

    restored = restore_from_offline_dir(RunStore(str(tmp_path / "runs")), "r", str(offline))
    assert restored.checkpoints == ["iter_000002"]
    assert RunStore(str(tmp_path / "runs")).open_run("r").load_checkpoint_bytes("iter_000002")[0] == b"weights of 2"


def test_an_existing_entry_is_never_restored_over(tmp_path):
    offline = as_offline_dir(make_source_run(tmp_path / "old"), tmp_path / "wandb")
    (tmp_path / "runs" / "r").mkdir(parents=True)
    (tmp_path / "runs" / "r" / "notes.txt").write_text("mine")
    with pytest.raises(WandbRestoreError, match=f"{tmp_path / 'runs' / 'r'} exists: refusing"):
        restore_from_offline_dir(RunStore(str(tmp_path / "runs")), "r", str(offline))
    assert os.listdir(tmp_path / "runs" / "r") == ["notes.txt"]


@pytest.mark.parametrize("damage, message", [
    (lambda mirror: (mirror / "checkpoints" / "iter_000002.pt").write_bytes(b"bit rot"),
     "iter_000002.pt: sha256 does not match"),
    (lambda mirror: (mirror / "checkpoints" / "iter_000002.pt").unlink(), "holds no checkpoint iter_000002"),
    (lambda mirror: (mirror / "metadata.json").unlink(), "no W&B run of nipflow run 'r'"),
    (lambda mirror: (mirror / "state.json").write_text('{"iteration": -1}'), "state.json: does not fit"),
])
def test_damaged_files_are_refused_naming_them_and_nothing_is_written(tmp_path, damage, message):
    offline = as_offline_dir(make_source_run(tmp_path / "old"), tmp_path / "wandb")
    damage(offline / "files" / MIRROR_DIR)
    with pytest.raises(WandbRestoreError, match=message):
        restore_from_offline_dir(RunStore(str(tmp_path / "runs")), "r", str(offline))
    assert not (tmp_path / "runs" / "r").exists()


def test_a_parent_dir_merges_the_run_dirs_of_the_latest_incarnation(tmp_path):
    wandb_dir = tmp_path / "wandb"
    stale = make_source_run(tmp_path / "stale", iterations=(6,), state_iteration=6)  # an older entry of the id
    as_offline_dir(stale, wandb_dir, stamp="20260101_000000", wandb_id="stale111")
    first = make_source_run(tmp_path / "live", iterations=(2,), state_iteration=2)
    as_offline_dir(first, wandb_dir, stamp="20260102_000000", wandb_id="live2222")
    second = RunStore(str(tmp_path / "live")).open_run("r")  # the same entry, resumed in a new process
    second.save_checkpoint_bytes("iter_000004", b"four", iteration=4)
    second.save_state(get_trainer_class("vanilla_ppo").State(iteration=4))
    shutil.rmtree(first / "checkpoints")  # the later W&B run dir holds only what it logged
    (first / "checkpoints").mkdir()
    second.save_checkpoint_bytes("iter_000004", b"four", iteration=4)
    as_offline_dir(first, wandb_dir, stamp="20260103_000000", wandb_id="live2222")
    other = make_source_run(tmp_path / "other", run_id="q")  # another run in the same W&B directory
    as_offline_dir(other, wandb_dir, stamp="20260104_000000", wandb_id="other333")

    store = RunStore(str(tmp_path / "runs"))
    restored = restore_from_offline_dir(store, "r", str(wandb_dir))

    assert restored.source == f"{wandb_dir} (2 W&B run dir(s))"
    assert (restored.iteration, restored.checkpoints) == (4, ["iter_000002", "iter_000004"])
    assert store.open_run("r").incarnation == second.incarnation != RunStore(str(tmp_path / "stale")).open_run(
        "r").incarnation
    with pytest.raises(WandbRestoreError, match="no W&B run of nipflow run 'ghost'"):
        restore_from_offline_dir(store, "ghost", str(wandb_dir))


class FakeArtifact:
    """What ``wandb.Api().run(...).logged_artifacts()`` yields, files given as ``{entry name: bytes}``."""

    def __init__(self, name, type_, files):
        self.name, self.type, self.files_ = name, type_, files
        self.version = name.rpartition(":")[2]
        self.downloads = 0

    def download(self, root):
        self.downloads += 1
        for entry, data in self.files_.items():
            path = Path(root) / entry
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        return root


class FakeApi:
    def __init__(self, run):
        self.wandb_run, self.calls = run, []

    def run(self, path):
        self.calls.append(("run", path))
        return self.wandb_run

    def runs(self, project, filters, order):
        self.calls.append(("runs", project, filters, order))
        return [self.wandb_run]


class FakeRun:
    path = ["ent", "proj", "abcd1234"]

    def __init__(self, artifacts):
        self.artifacts = artifacts

    def logged_artifacts(self):
        return list(self.artifacts)


def logged_artifacts(source: Path) -> list[FakeArtifact]:
    """The artifacts a run logged: one checkpoint with bare entry names (logged before entries kept
    their path), one with paths, two state versions (the older one stale), and an unrelated type."""
    files = tree(source, exclude=())
    ckpt = {k: v for k, v in files.items() if k.startswith("checkpoints/")}
    bundle = {k: v for k, v in files.items() if not k.startswith("checkpoints/")}
    stale_state = {**bundle, "state.json": b'{"agents": {}, "iteration": 1}'}
    return [
        FakeArtifact("state_r:v1", "state", bundle),
        FakeArtifact("checkpoint_r:v1", "checkpoint", {k: v for k, v in ckpt.items() if "000002" in k}),
        FakeArtifact("checkpoint_r:v0", "checkpoint",
                     {k.split("/")[1]: v for k, v in ckpt.items() if "000001" in k}),
        FakeArtifact("state_r:v0", "state", stale_state),
        FakeArtifact("model_r:v0", "model", {"weights.bin": b"x"}),
    ]


def test_api_artifacts_restore_the_newest_state_and_every_checkpoint(tmp_path):
    source = make_source_run(tmp_path / "old", iterations=(1, 2))
    artifacts = logged_artifacts(source)
    api = FakeApi(FakeRun(artifacts))
    store = RunStore(str(tmp_path / "runs"))

    restored = restore_from_wandb(store, "r", "ent/proj/abcd1234", api=api)

    assert api.calls == [("run", "ent/proj/abcd1234")]
    assert tree(tmp_path / "runs" / "r") == tree(source)
    assert (restored.iteration, restored.checkpoints, restored.source) == (
        2, ["iter_000001", "iter_000002"], "W&B run ent/proj/abcd1234")
    assert [a.downloads for a in artifacts] == [1, 1, 1, 0, 0]  # the stale state and the model: not read
    assert store.open_run("r").incarnation == json.loads((source / "metadata.json").read_text())["incarnation"]

    shutil.rmtree(tmp_path / "runs" / "r")
    api.calls.clear()
    restore_from_wandb(store, "r", None, project="nipflow-tests", api=api)
    assert api.calls == [("runs", "nipflow-tests", {"display_name": "r"}, "-created_at")]


def test_artifact_files_places_bare_entry_names_by_type(tmp_path):
    arts = [FakeArtifact("full_rollouts_r:v0", "full_rollouts", {"3.json": b"[]"}),
            FakeArtifact("raw_transcript_r:v0", "raw_transcript", {"raw_3.yaml": b"- a"}),
            FakeArtifact("full_rollouts_r:v1", "full_rollouts", {"rollouts/test_3.json": b"[1]"})]
    files = artifact_files(arts, str(tmp_path))
    assert {rel: Path(p).read_bytes() for rel, p in files.items()} == {
        "rollouts/3.json": b"[]", "transcripts/raw_3.yaml": b"- a", "rollouts/test_3.json": b"[1]"}


def test_cli_refuses_a_missing_wandb_dir_and_both_sources(tmp_path, capsys):
    assert main(["resume", "r", "--wandb-dir", str(tmp_path / "nope"), "--runs-dir", str(tmp_path),
                 "--direct"]) == 2
    assert f"--wandb-dir {tmp_path / 'nope'}: not a directory" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["resume", "r", "--wandb-dir", str(tmp_path), "--from-wandb", "--direct"])
    assert info.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


# -- real offline W&B runs -------------------------------------------------------------------

TRAIN = textwrap.dedent("""
    import json, sys
    from nip_core.parameters import HyperParameters
    from nip_core.settings import ExperimentSettings
    from nip_core.trainers.build import build_trainer
    runs, data, stop, use_wandb, params = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1", sys.argv[5]
    settings = ExperimentSettings(run_id="gi", runs_dir=runs, data_dir=data, use_wandb=use_wandb, show_progress=False)
    trainer = build_trainer(HyperParameters.from_dict(json.loads(params)), settings)
    try:
        trainer.train() if stop < 0 else trainer.run_iterations(0, stop)  # stop: a run stopped there
    finally:
        trainer.close()
""")


def _env(tmp_path) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO), "WANDB_MODE": "offline",
            "WANDB_SILENT": "true", "WANDB_DIR": str(tmp_path / "wandb"), "RL_WARNINGS": "0",
            "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HOME": str(tmp_path / "home"),
            "NIPFLOW_DATA_DIR": str(tmp_path / "data")}


def _train(tmp_path, runs: Path, stop: int, use_wandb: bool) -> None:
    subprocess.run([sys.executable, "-c", TRAIN, str(runs), str(tmp_path / "data"), str(stop),
                    "1" if use_wandb else "0", json.dumps(GI)], check=True, env=_env(tmp_path), timeout=300,
                   cwd=tmp_path)


def differences(x, y, path="") -> list[str]:
    """Paths at which two loaded checkpoints differ (tensors compared exactly)."""
    if isinstance(x, torch.Tensor):
        same = isinstance(y, torch.Tensor) and x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)
        return [] if same else [path]
    if hasattr(x, "items"):
        x, y = dict(x.items()), dict(y.items())
        if x.keys() != y.keys():
            return [f"{path}: keys"]
        return [d for k in x for d in differences(x[k], y[k], f"{path}.{k}")]
    if isinstance(x, (list, tuple)):
        if len(x) != len(y):
            return [f"{path}: length"]
        return [d for i, (u, v) in enumerate(zip(x, y)) for d in differences(u, v, f"{path}[{i}]")]
    if isinstance(x, np.ndarray):
        return [] if np.array_equal(x, y) else [path]
    return [] if x == y else [path]


def _train_rows(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith("time_")} for row in rows]


@pytest.mark.slow
def test_gi_run_resumes_from_its_offline_wandb_dir_bit_identically(tmp_path):
    (tmp_path / "wandb").mkdir()
    runs = tmp_path / "runs"
    _train(tmp_path, runs, 2, use_wandb=True)  # stopped after iteration 2 of 4
    lost = tree(runs / "gi")
    incarnation = json.loads((runs / "gi" / "metadata.json").read_text())["incarnation"]
    shutil.rmtree(runs / "gi")

    # what is restored: the same bytes (checked in a second store; the resume below writes on)
    check = RunStore(str(tmp_path / "check"))
    restored = restore_from_offline_dir(check, "gi", str(tmp_path / "wandb"))
    assert tree(tmp_path / "check" / "gi") == lost and (restored.iteration, restored.checkpoints) == (2, ["iter_000002"])

    resumed = subprocess.run([str(Path(sys.executable).parent / "nipflow"), "resume", "gi", "--wandb-dir",
                              str(tmp_path / "wandb"), "--runs-dir", str(runs), "--direct", "--progress", "off"],
                             env=_env(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "state at iteration 2, 1 checkpoint(s)" in resumed.stderr
    _train(tmp_path, tmp_path / "straight", -1, use_wandb=False)  # the uninterrupted run

    final, straight = runs / "gi" / "checkpoints" / "iter_000004.pt", tmp_path / "straight" / "gi" / "checkpoints"
    a = read_checkpoint(final.read_bytes(), source=str(final))
    b = read_checkpoint((straight / "iter_000004.pt").read_bytes(), source=str(straight / "iter_000004.pt"))
    assert a["iteration"] == b["iteration"] == 4 and len(a["agents"]) > 10
    # everything in it is equal (agents, optimiser, normaliser, RNGs, carried episodes), and
    # so are the bytes: the safetensors + JSON format writes equal states to equal bytes
    assert differences(a, b) == []
    assert final.read_bytes() == (straight / "iter_000004.pt").read_bytes()
    assert _train_rows(runs / "gi") == _train_rows(tmp_path / "straight" / "gi")  # iterations 0-3 and the test
    assert RunStore(str(runs)).open_run("gi").incarnation == incarnation
    # the resumed process went on logging to the same W&B run, without repeating a step
    logged = read_offline_runs(str(tmp_path / "wandb"))
    assert len(logged) == 2 and len({r["run_id"] for r in logged}) == 1
    assert [row["_step"] for r in logged for row in r["history"] if "mean_accuracy" in row][:4] == [0, 1, 2, 3]


LOG_TEXT_STATE = textwrap.dedent("""
    import sys
    from nip_core.logging import build_stat_logger
    from nip_core.parameters import HyperParameters
    from nip_core.runs import RunStore
    from nip_core.settings import ExperimentSettings
    from nip_core.trainers.registry import get_trainer_class
    runs = sys.argv[1]
    params = HyperParameters.from_dict({"scenario": "code_validation", "trainer": "pure_text_ei", "dataset": "t"})
    run = RunStore(runs).open_run("cv", params)
    state = get_trainer_class("pure_text_ei").State.model_validate({
        "iteration": 1, "train_loop_stage": "await_fine_tune_jobs", "tokens_used": 1234,
        "shared_model_groups": {"prover": {"fine_tune_job_id": "ftjob-7", "fine_tune_attempt": 2}}})
    run.save_state(state)
    run.write_json("fine_tune/iter_1_prover.json", {"job_id": "ftjob-7", "file_id": "file-3"})
    run.write_json("rollouts/1.json", [{"x": 1}])
    logger = build_stat_logger(params, ExperimentSettings(run_id="cv", runs_dir=runs), run)
    logger.log_artifact("full_rollouts_cv", "full_rollouts", [run.storage.full("rollouts/1.json")])
    logger.log_artifact("state_cv", "state", [run.storage.full("state.json"), run.storage.full("hyper_params.json")])
    logger.close()
""")


@pytest.mark.slow
def test_text_run_state_restores_with_its_incarnation(tmp_path):
    (tmp_path / "wandb").mkdir()
    runs = tmp_path / "runs"
    subprocess.run([sys.executable, "-c", LOG_TEXT_STATE, str(runs)], check=True, env=_env(tmp_path),
                   timeout=300, cwd=tmp_path)
    lost = tree(runs / "cv")
    meta = json.loads((runs / "cv" / "metadata.json").read_text())
    shutil.rmtree(runs / "cv")

    restored = restore_from_offline_dir(RunStore(str(runs)), "cv", str(tmp_path / "wandb"))

    assert tree(runs / "cv") == lost
    assert sorted(lost) == ["fine_tune/iter_1_prover.json", "hyper_params.json", "rollouts/1.json", "state.json"]
    run = RunStore(str(runs)).open_run("cv")
    assert run.incarnation == meta["incarnation"] == restored.incarnation
    assert run.metadata()["wandb_run_id"] == meta["wandb_run_id"]
    state = run.load_state(get_trainer_class("pure_text_ei").State)
    assert (state.iteration, state.train_loop_stage.value, state.shared_model_groups["prover"].fine_tune_job_id) == (
        1, "await_fine_tune_jobs", "ftjob-7")

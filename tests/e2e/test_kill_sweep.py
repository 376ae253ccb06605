"""Kill sweep: ``nipflow run`` SIGKILLed at seeded random moments until the run is done.

Each attempt is the real command line (``nipflow run ... --direct``, or through a Prefect
server). The sweep kills it either a random time after its first write to the run store
or right after its k-th write (watched from outside, by polling the run directory, so
that no test hook lives in production code), then starts the same command again. The
local API server loses the response of half of the upload and job-creation requests
(it acts on them first), so every create runs into an unknown outcome.

Checks once the run is done: the state says done; exactly one fine-tune job per
(iteration, group) of the run's incarnation and no upload that no job uses; rollout files
are never rewritten (same inode and bytes as when first seen); ``metrics.jsonl`` has one
parseable line per (kind, iteration); and for GI PPO the final checkpoint is byte for byte
the one of an uninterrupted run.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from nipflow_llm_server.testing import local_api_server
from nip_core.parameters.agents import GraphIsomorphismAgentParameters
from nip_core.trainers.checkpoint_files import read_checkpoint
from tests.run_files import run_json, run_text

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NIPFLOW = str(Path(sys.executable).parent / "nipflow")
REPO = Path(__file__).resolve().parents[2]
WATCHED = ("state.json", "metrics.jsonl", "rollouts", "fine_tune", "checkpoints", "stages", "models", "transcripts")
LOSE_POSTS = {"seed": 5, "endpoints": {g: {"rate_lose_response": 0.5, "methods": ["POST"]}
                                       for g in ("files", "fine_tuning.jobs")}}

EI_PARAMS = {"rl": {"num_iterations": 2, "rollouts_per_iteration": 24, "num_test_iterations": 1},
             "nip_protocol": {"max_message_rounds": 4},
             "dataset_options": {"max_train_size": 24, "max_test_size": 4},
             "text_rl": {"verifier_guess_replacement_proportion": 0.5, "test_scheme": "last"}}
GI_ITERATIONS = 4
GI_PARAMS = {"d_representation": 2,
             "agents": {"_default": GraphIsomorphismAgentParameters.construct_test_params().model_dump()},
             "rl": {"frames_per_batch": 16, "num_iterations": GI_ITERATIONS, "num_epochs": 1, "minibatch_size": 8,
                    "num_test_iterations": 1, "num_normalization_steps": 3}}


def fingerprint(path: Path) -> tuple[int, int, int]:
    st = path.stat()
    return st.st_ino, st.st_mtime_ns, st.st_size


def snapshot(run_dir: Path) -> dict[str, tuple[int, int, int]]:
    out = {}
    for name in WATCHED:
        top = run_dir / name
        if top.suffix:  # a file, with its versions of later epochs (state.g0000000003.json, ...)
            paths = sorted(run_dir.glob(f"{top.stem}*{top.suffix}"))
        else:
            paths = sorted(top.rglob("*")) if top.is_dir() else []
        for p in paths:
            try:
                if p.is_file() and not p.name.startswith("."):
                    out[str(p.relative_to(run_dir))] = fingerprint(p)
            except FileNotFoundError:  # replaced between listing and stat
                pass
    return out


@dataclass
class Sweep:
    """Runs ``command`` until it exits 0; the first ``kills`` attempts get a seeded kill plan.

    An attempt that finishes the run before its planned kill ends the sweep early, so
    :meth:`run` returns how many kills actually happened (how far a killed attempt gets
    depends on the machine's speed; the first attempts are always killed, since a run
    takes far longer than any plan).
    """

    command: list[str]
    run_dir: Path
    env: dict[str, str]
    kills: int
    seed: int
    log_dir: Path
    timeout_s: float = 600.0
    may_give_up: bool = False  # an attempt may end on its own with a one-line error (then it is started again)
    rollouts: dict[str, tuple[int, str]] = field(default_factory=dict)  # first (inode, sha256) seen
    plans: list[tuple[str, float]] = field(default_factory=list)
    gave_up: list[str] = field(default_factory=list)  # the error line of each attempt that gave up

    def _check_rollouts(self) -> None:
        for p in sorted((self.run_dir / "rollouts").glob("*.json")) if (self.run_dir / "rollouts").exists() else []:
            try:
                seen = (p.stat().st_ino, hashlib.sha256(p.read_bytes()).hexdigest())
            except FileNotFoundError:
                continue
            first = self.rollouts.setdefault(p.name, seen)
            assert seen == first, f"rollouts/{p.name} was rewritten"

    def run(self) -> int:
        rng = random.Random(self.seed)
        deadline = time.monotonic() + self.timeout_s
        killed = attempt = 0
        while True:
            attempt += 1
            plan = None
            if killed < self.kills:
                plan = ("after_write", rng.randint(1, 4)) if rng.random() < 0.5 else ("after_time", rng.uniform(0.02, 0.6))
                self.plans.append(plan)
            log = open(self.log_dir / f"attempt{attempt}.log", "wb")
            proc = subprocess.Popen(self.command, env=self.env, cwd=self.log_dir, stdout=log, stderr=subprocess.STDOUT)
            before, writes, first_write = snapshot(self.run_dir), 0, None
            while proc.poll() is None:
                assert time.monotonic() < deadline, f"sweep did not finish; see {self.log_dir}"
                now = snapshot(self.run_dir)
                if now != before:
                    writes += sum(1 for k, v in now.items() if before.get(k) != v)
                    first_write = first_write or time.monotonic()
                    before = now
                    self._check_rollouts()
                if plan and ((plan[0] == "after_write" and writes >= plan[1]) or
                             (plan[0] == "after_time" and first_write and time.monotonic() - first_write >= plan[1])):
                    proc.send_signal(signal.SIGKILL)
                    break
                time.sleep(0.005)
            rc = proc.wait()
            log.close()
            self._check_rollouts()
            if rc == 0:
                return killed
            said = (self.log_dir / f"attempt{attempt}.log").read_text(errors="replace")
            if rc != -signal.SIGKILL and self.may_give_up:
                errors = [line for line in said.splitlines() if line.startswith("nipflow: error:")]
                assert len(errors) == 1 and "Traceback" not in said, f"attempt {attempt} ended {rc}:\n{said[-3000:]}"
                self.gave_up.append(errors[0])
                continue
            assert rc == -signal.SIGKILL, f"attempt {attempt} failed with {rc}:\n{said[-3000:]}"
            killed += 1


def metrics_rows(run_dir: Path | str) -> list[dict]:
    """Every metrics line of the run at ``run_dir`` (a local path or an ``s3://`` URL), newest version."""
    lines = run_text(run_dir, "metrics.jsonl").splitlines()
    rows = [json.loads(line) for line in lines]  # every line parses: no torn or glued line
    keys = [(r.get("kind", "train"), r["iteration"]) for r in rows]
    assert len(keys) == len(set(keys)), f"duplicate metrics lines: {keys}"
    return rows


def base_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "OPENAI_", "WANDB_SERVICE"))}
    env.update({"NIPFLOW_DATA_DIR": str(tmp_path / "data"), "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1",
                "PYTHONPATH": str(REPO), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"})
    return env


def check_text_run(server, run_dir: Path | str, iterations: int = EI_PARAMS["rl"]["num_iterations"]) -> None:
    """The EI run at ``run_dir`` (a local path or an ``s3://`` URL) is done, each job made once."""
    from nip_core.runs import RunStore

    parent, run_id = posixpath.split(str(run_dir).rstrip("/"))
    run = RunStore(parent).open_run(run_id)
    state = run.read_json("state.json")
    assert state["train_loop_stage"] == "done" and state["iteration"] == iterations
    client = server.client()
    jobs = [j for j in client.fine_tuning.jobs.list(limit=100, metadata={"nipflow_run_id": run_id})
            if j.metadata.get("nipflow_incarnation") == run.incarnation]
    intents = [(j.metadata["nipflow_iteration"], j.metadata["nipflow_group"], j.metadata["nipflow_attempt"])
               for j in jobs]
    assert intents and len(intents) == len(set(intents)), f"a job was created twice: {sorted(intents)}"
    recorded = [name for name in run.list_files("fine_tune") if name.startswith("iter_")]
    assert sorted(f"iter_{i}_{g}.json" for i, g, _ in intents) == recorded
    files = [f for f in client.files.list() if f.filename.startswith(f"nipflow-{run.incarnation}-")]
    assert sorted(f.id for f in files) == sorted(j.training_file for j in jobs), "an upload no job uses"
    rows = metrics_rows(run_dir)
    assert sorted(r["iteration"] for r in rows if r["kind"] == "train") == list(range(iterations))
    assert sorted(n for n in run.list_files("rollouts") if n.endswith(".json")) == sorted(
        [f"{i}.json" for i in range(iterations)] + [f"test_{iterations - 1}.json"])


def ei_direct_command(runs: Path, params_file: Path, run_id: str = "ei") -> list[str]:
    """``nipflow run`` of pure-text EI on nipflow-cv with ``params_file``, ``--direct``, no W&B."""
    return [NIPFLOW, "run", "code_validation", "pure_text_ei", "--dataset", "nipflow-cv", "--run-id", run_id,
            "--runs-dir", str(runs), "--params", str(params_file), "--no-wandb", "--progress", "off", "--direct"]


def test_kill_sweep_pure_text_ei_direct_with_lost_responses(tmp_path):
    params_file = tmp_path / "ei.json"
    params_file.write_text(json.dumps(EI_PARAMS))
    with local_api_server(tmp_path / "api", job_time_scale=0.02, faults=LOSE_POSTS) as server:
        env = {**base_env(tmp_path), "OPENAI_BASE_URL": server.base_url}
        runs = tmp_path / "runs"
        sweep = Sweep(ei_direct_command(runs, params_file), runs / "ei", env, kills=6, seed=2024, log_dir=tmp_path)
        assert sweep.run() >= 2
        injected = server.fault_status()["injected"]
        assert injected.get("fine_tuning.jobs:lose_response", 0) + injected.get("files:lose_response", 0) >= 2
        check_text_run(server, runs / "ei")
    assert any(kind == "after_write" for kind, _ in sweep.plans) and any(k == "after_time" for k, _ in sweep.plans)


def final_checkpoint(run_dir: Path) -> bytes:
    manifest = json.loads((run_dir / "checkpoints" / f"iter_{GI_ITERATIONS:06d}.json").read_text())
    data = (run_dir / "checkpoints" / manifest["data"]).read_bytes()  # the data file it names
    assert hashlib.sha256(data).hexdigest() == manifest["sha256"]
    return data


def agent_tensors(data: bytes) -> dict[str, torch.Tensor]:
    state = read_checkpoint(data, source="the final checkpoint", map_location="cpu")
    return {k: v for k, v in state["agents"].items() if isinstance(v, torch.Tensor)}


def test_kill_sweep_gi_ppo_direct_ends_bit_identical(tmp_path):
    params_file = tmp_path / "gi.json"
    params_file.write_text(json.dumps(GI_PARAMS))
    env = base_env(tmp_path)
    runs = tmp_path / "runs"

    def command(run_id: str) -> list[str]:
        return [NIPFLOW, "run", "graph_isomorphism", "vanilla_ppo", "--protocol", "nip", "--dataset", "test",
                "--run-id", run_id, "--runs-dir", str(runs), "--params", str(params_file), "--no-wandb",
                "--progress", "off", "--checkpoint-every", "1", "--direct"]

    reference = subprocess.run(command("reference"), env=env, cwd=tmp_path, capture_output=True, text=True,
                               timeout=600)
    assert reference.returncode == 0, reference.stderr[-3000:]
    sweep = Sweep(command("killed"), runs / "killed", env, kills=5, seed=7, log_dir=tmp_path)
    assert sweep.run() >= 2
    state = run_json(runs / "killed", "state.json")
    assert state["iteration"] == GI_ITERATIONS
    ours, theirs = agent_tensors(final_checkpoint(runs / "killed")), agent_tensors(final_checkpoint(runs / "reference"))
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    rows = metrics_rows(runs / "killed")
    assert sorted(r["iteration"] for r in rows if r["kind"] == "train") == list(range(GI_ITERATIONS))
    ref_rows = {(r["kind"], r["iteration"]): r for r in metrics_rows(runs / "reference")}
    for r in rows:  # the same numbers as the uninterrupted run, iteration by iteration
        ref = ref_rows[(r["kind"], r["iteration"])]
        assert {k: v for k, v in r.items() if "time" not in k} == {k: v for k, v in ref.items() if "time" not in k}


def test_kill_sweep_pure_text_ei_through_prefect(prefect_server, tmp_path):
    params_file = tmp_path / "ei.json"
    params_file.write_text(json.dumps(EI_PARAMS))
    with local_api_server(tmp_path / "api", job_time_scale=0.02, faults=LOSE_POSTS) as server:
        env = {**base_env(tmp_path), "OPENAI_BASE_URL": server.base_url, "PREFECT_API_URL": prefect_server.api_url}
        runs = tmp_path / "runs"
        command = [NIPFLOW, "run", "code_validation", "pure_text_ei", "--dataset", "nipflow-cv", "--run-id", "ei-flow",
                   "--runs-dir", str(runs), "--params", str(params_file), "--no-wandb", "--progress", "off"]
        sweep = Sweep(command, runs / "ei-flow", env, kills=2, seed=99, log_dir=tmp_path)
        assert sweep.run() >= 1
        check_text_run(server, runs / "ei-flow")

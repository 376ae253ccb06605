"""Drivers paused at run-store writes wake after others took their run over: they change nothing.

A chain of drivers works on one run. Each is the real command line (``nipflow run`` for the
first, ``nipflow resume`` after it, ``--direct``) and is stopped with ``SIGSTOP`` at its own
moment (``tests/pause_on_write.py``: every thread stops, the lease's renewal thread included):
right after a chosen write, or as a chosen call begins — in the middle of an iteration's
training, or of the wait for fine-tune jobs. The next driver takes the run over once the
paused one's claim has expired (``NIPFLOW_LEASE_TTL_S=2``); the last one is not paused and
finishes the run. Then:

* what every reader sees — each file of the run, a mutable file by its newest version — is
  hashed; every paused driver gets ``SIGCONT`` at once; each must exit on its own,
  non-zero, naming its lost lease, without a traceback; the hashes must be unchanged;
* the run is complete and right: for pure-text EI one fine-tune job per (iteration, group,
  attempt), no upload that no job uses, one metrics line per iteration (the kill sweep's
  checks); for GI PPO the final state and one metrics line per iteration.

The moments, in run order: GI PPO — a checkpoint's tensors (before its manifest: the issue's
case), a manifest (before the state), a metrics line, the state, mid-iteration; pure-text EI —
a fine-tune record, the wait for the jobs, an iteration's rollouts (before their transcripts),
transcripts, a stage summary (before the state). Each chain runs with the run store on local disk
and on S3 (moto).
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import fsspec
import pytest

from nipflow_llm_server.testing import local_api_server
from nip_core.runs.fencing import is_mutable, untagged
from tests.e2e.test_kill_sweep import (
    EI_PARAMS, GI_PARAMS, NIPFLOW, base_env, check_text_run, metrics_rows,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
TTL_S = "2"


def is_stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def reader_view(location: str) -> dict[str, str]:
    """sha256 of every file a reader of the run sees (a mutable file: its newest version, by its plain name)."""
    fs, root = fsspec.core.url_to_fs(location)
    versions: dict[str, tuple[int, str]] = {}
    view = {}
    for path in fs.find(root):
        rel = posixpath.relpath(path, root)
        if rel.startswith(("leases/", "results/")) or posixpath.basename(rel).startswith("."):
            continue
        name, epoch = untagged(posixpath.basename(rel))
        logical = posixpath.join(posixpath.dirname(rel), name)
        if is_mutable(logical):
            if epoch >= versions.get(logical, (-1, ""))[0]:
                versions[logical] = (epoch, path)
            continue
        view[rel] = hashlib.sha256(fs.cat_file(path)).hexdigest()
    for logical, (_, path) in versions.items():
        view[logical] = hashlib.sha256(fs.cat_file(path)).hexdigest()
    return view


def run_chain(tmp_path: Path, run_args: list[str], resume_args: list[str], env: dict[str, str], location: str,
              moments: list[tuple[str, int]]) -> None:
    """Drive the run through ``moments`` (one paused driver each), finish it, wake them all, check.

    A moment is ``(pattern, n)`` for ``tests/pause_on_write.py``: a write, or a call's start.
    """
    env = {**env, "NIPFLOW_LEASE_TTL_S": TTL_S}
    paused: list[tuple[subprocess.Popen, Path]] = []
    try:
        for k, (pattern, nth) in enumerate(moments):
            args = run_args if k == 0 else resume_args
            command = [sys.executable, "-m", "tests.pause_on_write", pattern, str(nth), "--", *args]
            log = tmp_path / f"driver{k}.log"
            with open(log, "wb") as out:
                proc = subprocess.Popen(command, env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
            paused.append((proc, log))
            deadline = time.monotonic() + 240
            while not is_stopped(proc.pid):
                assert proc.poll() is None, f"driver {k} ended ({proc.returncode}) before its pause {pattern}:\n" + \
                    log.read_text(errors="replace")[-3000:]
                assert time.monotonic() < deadline, f"driver {k} never reached its pause {pattern}"
                time.sleep(0.01)
        last = subprocess.run([NIPFLOW, *resume_args], env=env, cwd=REPO, capture_output=True, text=True,
                              timeout=300)
        assert last.returncode == 0, last.stdout[-2000:] + last.stderr[-3000:]
        before = reader_view(location)
        for proc, _ in paused:
            proc.send_signal(signal.SIGCONT)
        for k, (proc, log) in enumerate(paused):
            rc = proc.wait(timeout=120)
            said = log.read_text(errors="replace")
            assert rc != 0 and "lease on" in said and "lost" in said, f"driver {k} exited {rc}:\n{said[-3000:]}"
            assert "Traceback" not in said, said[-3000:]
        after = reader_view(location)
        changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        assert not changed, f"a woken driver changed {changed}"
    finally:
        for proc, _ in paused:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()


GI_CHAIN_ITERATIONS = 6


def gi_args(tmp_path: Path, runs: str, run_id: str) -> tuple[list[str], list[str]]:
    params_file = tmp_path / "gi.json"
    params_file.write_text(json.dumps({**GI_PARAMS, "rl": {**GI_PARAMS["rl"], "num_iterations": GI_CHAIN_ITERATIONS}}))
    common = ["--runs-dir", runs, "--no-wandb", "--progress", "off", "--checkpoint-every", "1", "--direct"]
    return (["run", "graph_isomorphism", "vanilla_ppo", "--protocol", "nip", "--dataset", "test", "--run-id", run_id,
             "--params", str(params_file), *common], ["resume", run_id, *common])


#: GI PPO: a moment after each kind of write of an RL run, and one between writes
GI_MOMENTS = [
    ("checkpoints/iter_000001.pt", 1),  # the tensors, before their manifest
    ("checkpoints/iter_000002.json", 1),  # the manifest, before the state
    ("append_line:metrics*.jsonl", 1),  # a metrics line
    ("write_bytes:state*.json", 1),  # the state
    # in the middle of the next iteration: its second minibatch's loss
    ("call:nip_core.trainers.tensordict_rl:TensorDictRlTrainer._loss_forward", 2),
]
#: pure-text EI: a moment after each kind of write of a text run, and one in the await stage
EI_MOMENTS = [
    ("write_bytes:fine_tune/iter_0_verifier*.json", 1),  # a fine-tune record
    ("call:nip_core.trainers.fine_tune_waiter:FineTuneWaiter.poll", 1),  # waiting for the jobs
    ("rollouts/1.json", 1),  # an iteration's rollouts, before their transcripts
    ("transcripts/raw_1.*", 1),  # the transcripts, before the stage's summary
    ("stages/it1_sample_rollouts.json", 1),  # a stage summary, before the state
]


def store_of(kind: str, tmp_path: Path, request) -> tuple[str, dict[str, str]]:
    """The runs location (local folder or a fresh prefix of the moto bucket) and its environment."""
    if kind == "local":
        return str(tmp_path / "runs"), base_env(tmp_path)
    s3 = request.getfixturevalue("s3_endpoint")
    return f"s3://{s3.bucket}/paused-{uuid.uuid4().hex[:8]}", {**base_env(tmp_path), **s3.env}


@pytest.mark.parametrize("store", ["local", "s3"])
def test_gi_ppo_drivers_paused_at_each_write_kind_change_nothing_when_they_wake(store, tmp_path, request):
    runs, env = store_of(store, tmp_path, request)
    run_args, resume_args = gi_args(tmp_path, runs, "gi")
    run_chain(tmp_path, run_args, resume_args, env, f"{runs}/gi", GI_MOMENTS)
    from nip_core.runs import RunStore

    run = RunStore(runs).open_run("gi")
    assert run.read_json("state.json")["iteration"] == GI_CHAIN_ITERATIONS
    assert max(run.list_checkpoints()) == f"iter_{GI_CHAIN_ITERATIONS:06d}"
    rows = metrics_rows(f"{runs}/gi")
    assert sorted(r["iteration"] for r in rows if r["kind"] == "train") == list(range(GI_CHAIN_ITERATIONS))


@pytest.mark.parametrize("store", ["local", "s3"])
def test_pure_text_ei_drivers_paused_at_each_write_kind_change_nothing_when_they_wake(store, tmp_path, request):
    runs, env = store_of(store, tmp_path, request)
    params_file = tmp_path / "ei.json"
    params_file.write_text(json.dumps(EI_PARAMS))
    common = ["--runs-dir", runs, "--no-wandb", "--progress", "off", "--direct"]
    run_args = ["run", "code_validation", "pure_text_ei", "--dataset", "nipflow-cv", "--run-id", "ei",
                "--params", str(params_file), *common]
    with local_api_server(tmp_path / "api", job_time_scale=0.2) as server:
        env = {**env, "OPENAI_BASE_URL": server.base_url}
        run_chain(tmp_path, run_args, ["resume", "ei", *common], env, f"{runs}/ei", EI_MOMENTS)
        check_text_run(server, f"{runs}/ei")

"""A graph-isomorphism run killed mid-way and resumed in a new process: one W&B run id,
no duplicated metric lines, no secret anywhere, and ``nipflow report`` on the result."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from nip_core.logging.wandb_reader import read_offline_runs
from tests.run_files import run_file, run_json

SENTINEL = "sk-SENTINEL-tracking-0123456789abcdefXYZ"

PARAMS = {
    "scenario": "graph_isomorphism", "trainer": "vanilla_ppo", "dataset": "test", "seed": 3,
    "d_representation": 4,
    "rl": {"frames_per_batch": 64, "num_iterations": 8, "num_epochs": 1, "minibatch_size": 32,
           "num_normalization_steps": 10, "num_test_iterations": 1, "use_shared_body": False},
    "nip_protocol": {"max_message_rounds": 4, "min_message_rounds": 1},
    "agents": {"_default": {"num_gnn_layers": 1, "d_gnn": 4, "d_gin_mlp": 8, "num_transformer_layers": 1,
                            "num_heads": 2, "d_transformer": 4, "d_transformer_mlp": 8}},
}


def nipflow(*args, env, **kwargs):
    return subprocess.Popen([sys.executable, "-m", "flows.cli", *args], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs)


@pytest.mark.e2e
def test_killed_run_resumes_with_one_wandb_run_and_no_duplicates(tmp_path):
    params = tmp_path / "params.json"
    params.write_text(json.dumps(PARAMS))
    runs = tmp_path / "runs"
    # no inherited W&B service token: the subprocesses must each own their W&B service
    env = {**{k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}, "OPENAI_API_KEY": SENTINEL, "NIPFLOW_DATA_DIR": str(tmp_path / "data"),
           "WANDB_MODE": "offline", "PYTHONPATH": os.getcwd()}
    common = ["--runs-dir", str(runs), "--direct", "--checkpoint-every", "1", "--progress", "off"]
    first = nipflow("run", "graph_isomorphism", "vanilla_ppo", "--params", str(params), "--run-id", "trk",
                    *common, env=env)
    metrics = runs / "trk" / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and first.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
            break
        time.sleep(0.2)
    assert first.poll() is None, first.stdout.read()
    first.send_signal(signal.SIGKILL)
    first.wait()
    done_before = len(metrics.read_text().splitlines())
    assert 3 <= done_before < 8

    second = nipflow("resume", "trk", *common, env=env)
    out, _ = second.communicate(timeout=300)
    assert second.returncode == 0, out

    rows = [json.loads(line) for line in run_file(runs / "trk", "metrics.jsonl").read_text().splitlines()]
    train = [r["iteration"] for r in rows if r["kind"] == "train"]
    assert train == list(range(8))  # every iteration once, in order
    assert [r["iteration"] for r in rows if r["kind"] == "test"] == [8]

    wandb_runs = read_offline_runs(str(runs / "trk"))
    assert len(wandb_runs) == 2  # the killed process and the resumed one
    meta = run_json(runs / "trk", "metadata.json")
    assert {r["run_id"] for r in wandb_runs} == {meta["wandb_run_id"]}
    steps = [row["_step"] for r in wandb_runs for row in r["history"] if "mean_accuracy" in row]
    assert len(steps) == len(set(steps))  # no step logged twice to W&B
    assert wandb_runs[-1]["config"]["rl"]["num_iterations"] == 8  # the killed file may lack its run record
    # One checkpoint version per checkpoint, each followed by a state version (what a
    # W&B restore needs); entries are named by their run-store path.
    artifacts = [a for r in wandb_runs for a in r["artifacts"]]
    assert {(a["name"], a["type"]) for a in artifacts} == {("checkpoint_trk", "checkpoint"), ("state_trk", "state")}
    kinds = [a["type"] for a in artifacts]
    assert kinds[0::2] == ["checkpoint"] * (len(kinds) // 2) and kinds[1::2] == ["state"] * (len(kinds) // 2)
    assert ["checkpoints/iter_000008.json", "checkpoints/iter_000008.pt"] in [a["files"] for a in artifacts]
    assert {"state.json", "hyper_params.json", "metadata.json"} <= set(artifacts[-1]["files"])

    for path in (runs / "trk").rglob("*"):
        if path.is_file():
            assert SENTINEL.encode() not in path.read_bytes(), path

    report = nipflow("report", "trk", "--runs-dir", str(runs), "--out", str(tmp_path / "report"), env=env)
    out, _ = report.communicate(timeout=120)
    assert report.returncode == 0, out
    for name in ("rewards", "accuracy", "episode_length"):
        assert (tmp_path / "report" / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = (tmp_path / "report" / "summary.md").read_text()
    last = [r for r in rows if r["kind"] == "train"][-1]
    assert f"| verifier train accuracy | {last['mean_decided_accuracy']:.4f} |" in text
    assert f"| verifier mean episode reward | {last['verifier.mean_episode_reward']:.4f} |" in text

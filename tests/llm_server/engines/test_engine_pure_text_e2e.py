"""A 1-iteration expert-iteration run (nip protocol) and a MALT run complete against
``nipflow-tiny-lm`` served by ``nipflow api-server --engine transformers``, driven by
``nipflow run ... --direct`` with ``OPENAI_BASE_URL`` at that server.

The untrained tiny model writes random bytes: its verifier never produces a valid question
(retries are off to keep the run short). What is checked is the plumbing: prompts of the
real scenario rendered, generated in batches and parsed, the run stored and finished. (One
iteration never fine-tunes: the last iteration of a pure-text run goes straight to the test
stage.) In the round where the verifier must decide, the engine's structured output holds
its reply to ``Decision: accept`` / ``Decision: reject`` (``decision_constraint`` ``auto``):
with ``solo_verifier`` (one round, a decision) every episode is decided at the first try.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[4]
COMMON = [
    "agents._default.model_name=nipflow-tiny-lm", "rl.num_iterations=1", "rl.num_test_iterations=1",
    "agents._default.max_tokens_per_message=24", "agents._default.num_invalid_generation_retries=0",
    "dataset_options.max_test_size=2", "text_rl.test_scheme=last",
]
SETTINGS = {
    "pure_text_ei": ["rl.rollouts_per_iteration=8", "nip_protocol.max_message_rounds=4",
                     "dataset_options.max_train_size=8"],
    "pure_text_malt": ["rl.rollouts_per_iteration=4", "nip_protocol.max_message_rounds=3",
                       "pure_text_malt.num_responses_per_timestep=2", "dataset_options.max_train_size=4"],
}


@pytest.mark.parametrize("trainer", ["pure_text_ei", "pure_text_malt"])
def test_a_one_iteration_run_completes_against_the_tiny_model(tiny_server, tmp_path, trainer):
    runs = tmp_path / "runs"
    cmd = [sys.executable, "-m", "flows.cli", "run", "code_validation", trainer, "--protocol", "nip", "--direct",
           "--no-wandb", "--progress", "off", "--run-id", "tiny", "--runs-dir", str(runs)]
    for item in COMMON + SETTINGS[trainer]:
        cmd += ["--set", item]
    env = {**os.environ, "OPENAI_BASE_URL": tiny_server.base_url, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = runs / "tiny"
    state = json.loads((run / "state.json").read_text())
    assert state["iteration"] == 1 and state["train_loop_stage"] == "done"
    assert state["tokens_used"] > 0  # usage of the tiny model's own tokens was counted
    assert json.loads((run / "models" / "iter_0.json").read_text()) == {"prover": "nipflow-tiny-lm",
                                                                       "verifier": "nipflow-tiny-lm"}
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [(m["kind"], m["iteration"]) for m in lines] == [("train", 0), ("test", 0)]
    assert any((run / "rollouts").iterdir())


def test_with_structured_output_the_untrained_verifier_decides_every_episode(tiny_server, tmp_path):
    runs = tmp_path / "runs"
    cmd = [sys.executable, "-m", "flows.cli", "run", "code_validation", "pure_text_ei", "--protocol", "solo_verifier",
           "--direct", "--no-wandb", "--progress", "off", "--run-id", "solo", "--runs-dir", str(runs)]
    for item in COMMON + ["rl.rollouts_per_iteration=8", "dataset_options.max_train_size=8"]:
        cmd += ["--set", item]
    env = {**os.environ, "OPENAI_BASE_URL": tiny_server.base_url, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    train, test = [json.loads(line) for line in (runs / "solo" / "metrics.jsonl").read_text().splitlines()]
    assert train["verifier.retry_proportion"] == 0.0 and test["verifier.test_retry_proportion"] == 0.0
    # every episode decided in round 0: a decided episode's verifier reward is +1 or -1, so the
    # mean reward is 2 x accuracy - 1 only when none ended undecided
    for stats, prefix in ((train, ""), (test, "test_")):
        assert stats[f"{prefix}mean_episode_length"] == 0.0
        reward = stats[f"verifier.{prefix}mean_episode_reward"]
        assert reward == pytest.approx(2 * stats[f"{prefix}mean_accuracy"] - 1)

"""Kill and resume a pure-text run against the transformers engine, as against the selection one.

The same sweep as ``tests/e2e/test_kill_sweep.py`` (SIGKILLs at seeded moments, right
after run-store writes or a random time later, the same command started again until the
run is done) with ``nipflow-tiny-lm`` behind ``nipflow api-server --engine transformers``
losing half of the responses to uploads and job creations. The untrained tiny model
rarely produces usable fine-tune data, so what this shows is resume: the run ends done,
rollouts are never rewritten, one metrics line per (kind, iteration), and no fine-tune
intent has two jobs.
"""

from __future__ import annotations


import pytest

from tests.e2e.test_kill_sweep import NIPFLOW, Sweep, base_env, metrics_rows
from tests.run_files import run_json

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SETTINGS = ["agents._default.model_name=nipflow-tiny-lm", "rl.num_iterations=2", "rl.num_test_iterations=1",
            "agents._default.max_tokens_per_message=24", "agents._default.num_invalid_generation_retries=0",
            "rl.rollouts_per_iteration=8", "nip_protocol.max_message_rounds=4", "dataset_options.max_train_size=8",
            "dataset_options.max_test_size=2", "text_rl.test_scheme=last"]


def test_kill_sweep_against_the_transformers_engine(tiny_server, tiny_client, tmp_path):
    tiny_server.set_faults({"seed": 3, "endpoints": {g: {"rate_lose_response": 0.5, "methods": ["POST"]}
                                                     for g in ("files", "fine_tuning.jobs")}})
    runs = tmp_path / "runs"
    command = [NIPFLOW, "run", "code_validation", "pure_text_ei", "--protocol", "nip", "--run-id", "tiny-kill",
               "--runs-dir", str(runs), "--no-wandb", "--progress", "off", "--direct"]
    for item in SETTINGS:
        command += ["--set", item]
    env = {**base_env(tmp_path), "OPENAI_BASE_URL": tiny_server.base_url}
    sweep = Sweep(command, runs / "tiny-kill", env, kills=3, seed=11, log_dir=tmp_path)
    assert sweep.run() >= 2
    tiny_server.clear_faults()
    state = run_json(runs / "tiny-kill", "state.json")
    assert state["train_loop_stage"] == "done" and state["iteration"] == 2
    rows = metrics_rows(runs / "tiny-kill")
    assert sorted(r["iteration"] for r in rows if r["kind"] == "train") == [0, 1]
    jobs = [j for j in tiny_client.fine_tuning.jobs.list(limit=100, metadata={"nipflow_run_id": "tiny-kill"})]
    intents = [(j.metadata["nipflow_iteration"], j.metadata["nipflow_group"], j.metadata["nipflow_attempt"])
               for j in jobs]
    assert len(intents) == len(set(intents))
    assert set(sweep.rollouts) >= {"0.json", "1.json"}

"""``make text-local`` (``./scripts/text_local.sh``): expert iteration on the built-in real model, offline.

The documented command, as it is: it starts the transformers engine's server on
``smollm2-135m-instruct``, runs ``nipflow run code_validation pure_text_ei --params
configs/cv_smollm2_short.json`` through a temporary Prefect server, and stops the server. The
run must train (one LoRA job on the verifier's examples, the model switched to its result),
decide validly in every episode, test the fine-tuned verifier on 8 held-out items, and end
with a result card whose lines per iteration are the run store's figures. The verifier alone
(``solo_verifier``): a nip run of the same size took 11 min of a CI worker.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from nip_core.logging.result_card import result_card
from nip_core.runs import RunStore
from nipflow_llm_server.engines import smollm2

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.long(150)
def test_text_local_trains_expert_iteration_on_the_real_model_offline(tmp_path, smollm2_data_dir):
    runs = tmp_path / "runs"
    env = {**os.environ, "NIPFLOW_DATA_DIR": str(smollm2_data_dir), "NIPFLOW_RUNS_DIR": str(runs)}
    done = subprocess.run(["./scripts/text_local.sh"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=1500)
    assert done.returncode == 0, done.stderr[-3000:]
    store = RunStore(str(runs))
    [run_id] = [d.name for d in runs.iterdir() if d.is_dir() and not d.name.startswith(".")]
    run = store.open_run(run_id)
    assert (run.params.interaction_protocol, run.params.agent_params("verifier").model_name) == (
        "solo_verifier", smollm2.NAME)
    card = result_card(run)
    assert (card.status, card.iterations_done) == ("completed", 2)
    # the verifier's examples (three quarters with the true label) always make a job
    assert [j.group for j in card.jobs] == ["verifier"] and card.fine_tune_jobs >= 1 and card.trained_tokens > 0
    train = [r for r in run.read_metrics() if r["kind"] == "train"]
    [test] = [r for r in run.read_metrics() if r["kind"] == "test"]
    assert test["iteration"] == 1 and sum(v for k, v in test.items() if k.startswith("test_count_by_kind.")) == 8
    assert all(r["valid_decision_rate"] == 1.0 for r in train)
    state = run.read_json("state.json", "state")
    assert state["shared_model_groups"]["verifier"]["fine_tuned_model_name"].startswith(f"ft:{smollm2.NAME}:")
    # the card the script printed: one line per iteration, the run store's figures
    lines = {line.split("  ", 1)[0]: line.split("  ", 1)[1].strip() for line in done.stdout.splitlines()
             if line.startswith("iteration ") and "  " in line}
    assert lines["iteration 0"].startswith(f"valid decisions 100% · accuracy {train[0]['mean_accuracy']:.3f} · ")
    assert "fine-tune verifier " in lines["iteration 0"]
    assert lines["iteration 1"].startswith(f"valid decisions 100% · accuracy {train[1]['mean_accuracy']:.3f} · "
                                           f"test {test['test_mean_accuracy']:.3f} · ")

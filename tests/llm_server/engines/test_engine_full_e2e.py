"""``--full-fine-tune`` and ``--base-model NAME=DIR``: a base model loaded from a local
directory, and SFT that trains every weight (the saved model is a whole model, not an
adapter)."""

from __future__ import annotations

import json

import pytest

from nipflow_llm_server.engines.tiny import build_tiny_model, build_tokenizer
from nipflow_llm_server.testing import local_api_server
from tests.llm_server.engines.engine_helpers import clue_examples, greedy_hits, jsonl, wait_for_job

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def full_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("full")
    model_dir = root / "tiny-copy"
    build_tiny_model().save_pretrained(model_dir)
    build_tokenizer().save_pretrained(model_dir)
    options = {"device": "cpu", "full_fine_tune": True, "base_models": [f"tiny-copy={model_dir}"]}
    with local_api_server(root, job_time_scale=0.02, engine="transformers", engine_options=options,
                          startup_timeout=120.0) as server:
        yield server


def test_a_base_model_from_a_directory_is_served_like_the_builtin_one(full_server):
    client = full_server.client(timeout=120.0)
    assert {m.id for m in client.models.list()} == {"nipflow-tiny-lm", "tiny-copy"}
    prompt = [{"role": "user", "content": "same weights?"}]
    texts = {m: client.chat.completions.create(model=m, messages=prompt, seed=4, max_tokens=16).choices[0].message.content
             for m in ("nipflow-tiny-lm", "tiny-copy")}
    assert texts["nipflow-tiny-lm"] == texts["tiny-copy"]  # the directory holds the tiny model's seeded weights


def test_full_fine_tuning_saves_a_whole_model_that_answers_the_targets(full_server):
    client = full_server.client(timeout=120.0)
    examples = clue_examples(24, seed=3)
    f = client.files.create(file=("sft.jsonl", jsonl(examples)), purpose="fine-tune")
    job = client.fine_tuning.jobs.create(model="nipflow-tiny-lm", training_file=f.id, seed=1, hyperparameters={
        "n_epochs": 6, "batch_size": 2})
    job = wait_for_job(client, job.id)
    assert job.status == "succeeded", job.error
    final = full_server.data_dir / "models" / job.id / "final"
    assert json.loads((final / "nipflow_model.json").read_text())["kind"] == "full"
    assert (final / "config.json").is_file() and not (final / "adapter_config.json").exists()
    hits = greedy_hits(client, job.fine_tuned_model, examples)
    print(f"full SFT (transformers engine): targets answered greedily {hits}/24 after fine-tuning")
    assert hits >= 0.9 * 24

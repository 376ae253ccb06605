"""Crash recovery is the engine's too: a transformers-engine server killed (SIGKILL) while a
TRL job runs restarts that job's training from the beginning and serves its adapter."""

from __future__ import annotations

import time

import pytest

from nipflow_llm_server.launcher import LocalApiServer
from tests.llm_server.engines.engine_helpers import clue_examples, greedy_hits, jsonl, wait_for_job

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
OPTIONS = {"device": "cpu"}


def test_a_job_killed_while_running_is_trained_again_after_the_restart(tmp_path):
    examples = clue_examples(24, seed=3)
    data = tmp_path / "api"
    # job_time_scale 1: about 5 s until the job runs, then at least 20 s running
    server = LocalApiServer(data, job_time_scale=1.0, engine="transformers", engine_options=OPTIONS,
                            startup_timeout=120.0).start()
    try:
        client = server.client(timeout=120.0)
        f = client.files.create(file=("sft.jsonl", jsonl(examples)), purpose="fine-tune")
        job = client.fine_tuning.jobs.create(model="nipflow-tiny-lm", training_file=f.id, seed=1,
                                             hyperparameters={"n_epochs": 8, "batch_size": 2})
        deadline = time.monotonic() + 60
        while client.fine_tuning.jobs.retrieve(job.id).status != "running":
            assert time.monotonic() < deadline
            time.sleep(0.1)
        time.sleep(1.0)  # inside the training
    finally:
        server.kill()
    with LocalApiServer(data, job_time_scale=0.02, engine="transformers", engine_options=OPTIONS,
                        startup_timeout=120.0) as again:
        client = again.client(timeout=120.0)
        done = wait_for_job(client, job.id)
        assert done.status == "succeeded", done.error
        warnings = [e.message for e in client.fine_tuning.jobs.list_events(job.id, limit=100) if e.level == "warn"]
        assert any("training restarts from the beginning" in m for m in warnings)
        assert greedy_hits(client, done.fine_tuned_model, examples) >= 0.9 * 24

"""Persistence: graceful and SIGKILL restarts on the same data directory lose nothing."""

from __future__ import annotations

import os
import signal
import time

import pytest

from nipflow_llm_server.launcher import LocalApiServer, ensure_local_server
from nipflow_llm_server.server.cli import read_server_file
from tests.llm_server.llm_helpers import jsonl, sft_examples, wait_for_job

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_sigkill_while_a_job_runs_then_restart_resumes_it(tmp_path):
    data = tmp_path / "api"
    examples = sft_examples(20, seed=3)
    prompt = examples[0]["messages"][:-1]

    with LocalApiServer(data, job_time_scale=0.02) as server:
        client = server.client(max_retries=0)
        train_file = client.files.create(file=("train.jsonl", jsonl(examples)), purpose="fine-tune")
        other = client.files.create(file=("notes.txt", b"keep me"), purpose="user_data")
        first = wait_for_job(client, client.fine_tuning.jobs.create(model="gpt-4o-mini", training_file=train_file.id, seed=1).id)
        assert first.status == "succeeded"
        answer = client.chat.completions.create(model=first.fine_tuned_model, messages=prompt, seed=3, n=3)
        before = [c.message.content for c in answer.choices]

    # a slow job (about 4 s of running), killed while it runs
    server = LocalApiServer(data, job_time_scale=0.2).start()
    client = server.client(max_retries=0)
    assert client.fine_tuning.jobs.retrieve(first.id) == first  # a graceful restart lost nothing
    job = client.fine_tuning.jobs.create(model="gpt-4o-mini", training_file=train_file.id, seed=2, metadata={"k": "v"})
    wait_for_job(client, job.id, statuses=("running",))
    time.sleep(0.3)
    server.kill()

    with LocalApiServer(data, job_time_scale=0.02) as server:
        client = server.client(max_retries=0)
        done = wait_for_job(client, job.id)
        assert done.status == "succeeded" and done.metadata == {"k": "v"} and done.seed == 2
        messages = [e.message for e in client.fine_tuning.jobs.list_events(job.id)]
        assert any(m.startswith("The server restarted while the job was running") for m in messages)
        assert messages[0] == "The job has successfully completed"
        steps = [c.step_number for c in client.fine_tuning.jobs.checkpoints.list(job.id)]
        assert steps == sorted(set(steps), reverse=True) and len(steps) == 3  # only the final attempt's
        # everything from before the crash is intact
        assert client.fine_tuning.jobs.retrieve(first.id) == first
        assert client.files.content(other.id).content == b"keep me"
        assert client.files.content(train_file.id).content == jsonl(examples)
        again = client.chat.completions.create(model=first.fine_tuned_model, messages=prompt, seed=3, n=3)
        assert [c.message.content for c in again.choices] == before
        assert {j.id for j in client.fine_tuning.jobs.list()} == {first.id, job.id}
        assert {first.fine_tuned_model, done.fine_tuned_model} <= {m.id for m in client.models.list()}


def test_ensure_local_server_reuses_a_running_server(tmp_path):
    data = tmp_path / "shared"
    url = ensure_local_server(data, job_time_scale=0.02)
    pid = read_server_file(data)["pid"]
    try:
        assert ensure_local_server(data) == url
        assert read_server_file(data)["pid"] == pid
        # a second server on the same directory refuses to start (exit status 3)
        with pytest.raises(Exception, match="another server") as info:
            LocalApiServer(data, startup_timeout=20).start()
        assert getattr(info.value, "exit_code", None) == 3
    finally:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 20
    while read_server_file(data) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert read_server_file(data) is None  # removed on clean exit
    url2 = ensure_local_server(data, job_time_scale=0.02)
    try:
        assert read_server_file(data)["pid"] != pid and url2.endswith("/v1")
    finally:
        os.kill(read_server_file(data)["pid"], signal.SIGTERM)

"""Every endpoint of the local server, through the official openai client."""

from __future__ import annotations

import re

import openai
import pytest
from openai.types import FileObject, Model
from openai.types.chat import ChatCompletion
from openai.types.fine_tuning import FineTuningJob, FineTuningJobEvent
from openai.types.fine_tuning.jobs import FineTuningJobCheckpoint

from tests.llm_server.llm_helpers import dpo_examples, jsonl, sft_examples, verifier_system, wait_for_job

pytestmark = pytest.mark.e2e

VERIFIER = [{"role": "system", "content": verifier_system("add two numbers", "a, b = map(int, input().split())\nprint(a + b)")}]


@pytest.fixture(scope="module")
def sft_file(client):
    return client.files.create(file=("train.jsonl", jsonl(sft_examples(12))), purpose="fine-tune")


@pytest.fixture(scope="module")
def finished_job(client, sft_file):
    job = client.fine_tuning.jobs.create(
        model="gpt-4o-mini", training_file=sft_file.id, suffix="unit", seed=42,
        metadata={"run_id": "r1", "group": "prover"}, method={"type": "supervised"},
    )
    return wait_for_job(client, job.id)


# -- models ---------------------------------------------------------------------------------


def test_models_list_and_retrieve(client):
    models = list(client.models.list())
    assert all(isinstance(m, Model) for m in models)
    ids = {m.id for m in models}
    assert {"gpt-4o-mini-2024-07-18", "gpt-4o-mini", "gpt-4o-2024-08-06", "gpt-3.5-turbo"} <= ids
    model = client.models.retrieve("gpt-4o-mini")
    assert (model.id, model.owned_by, model.object) == ("gpt-4o-mini", "system", "model")


def test_unknown_model_is_404_model_not_found(client):
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("gpt-9")
    assert info.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-9", messages=VERIFIER)
    assert info.value.status_code == 404 and info.value.code == "model_not_found"
    assert info.value.body["type"] == "invalid_request_error"


def test_unknown_route_has_openai_error_shape(api_server):
    import urllib.error
    import urllib.request

    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(api_server.base_url + "/embeddings", timeout=5)
    assert info.value.code == 404
    assert b'"type": "invalid_request_error"' in info.value.read().replace(b'":"', b'": "')


# -- chat completions -----------------------------------------------------------------------


def test_chat_completion_object_and_usage(client):
    resp = client.chat.completions.create(model="gpt-4o-mini", messages=VERIFIER, n=3, seed=5, temperature=1.0)
    assert isinstance(resp, ChatCompletion)
    assert resp.object == "chat.completion" and resp.model == "gpt-4o-mini" and len(resp.choices) == 3
    assert [c.index for c in resp.choices] == [0, 1, 2]
    for choice in resp.choices:
        assert choice.finish_reason == "stop" and choice.message.role == "assistant"
        text = choice.message.content
        assert text in ("Decision: accept", "Decision: reject") or text.startswith("Question for Expert: ")
    assert resp.usage.prompt_tokens > 50
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens
    again = client.chat.completions.create(model="gpt-4o-mini", messages=VERIFIER, n=3, seed=5, temperature=1.0)
    assert [c.message.content for c in again.choices] == [c.message.content for c in resp.choices]


def test_max_tokens_stop_and_logprobs(client):
    messages = [{"role": "system", "content": "Say 'Decision: accept' or 'Decision: reject'."}]
    resp = client.chat.completions.create(model="gpt-4o-mini", messages=messages, max_tokens=1, seed=1)
    assert (resp.choices[0].message.content, resp.choices[0].finish_reason) == ("Decision", "length")
    assert resp.usage.completion_tokens == 1
    resp = client.chat.completions.create(model="gpt-4o-mini", messages=messages, max_completion_tokens=2, seed=1)
    assert resp.choices[0].message.content == "Decision:"
    resp = client.chat.completions.create(model="gpt-4o-mini", messages=messages, stop=[":"], seed=1)
    assert (resp.choices[0].message.content, resp.choices[0].finish_reason) == ("Decision", "stop")
    resp = client.chat.completions.create(model="gpt-4o-mini", messages=messages, logprobs=True, top_logprobs=2, seed=1)
    content = resp.choices[0].logprobs.content
    assert [t.token for t in content][:2] == ["Decision", ":"]
    assert content[0].logprob == 0.0 and content[2].logprob < 0
    assert {t.token for t in content[2].top_logprobs} == {" accept", " reject"}
    assert content[2].bytes == list(content[2].token.encode())


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"temperature": 3.0}, "temperature"),
        ({"n": 0}, "n"),
        ({"stream": True}, "stream"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ],
)
def test_invalid_chat_requests_are_400(client, kwargs, param):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="gpt-4o-mini", messages=VERIFIER, **kwargs)
    assert info.value.status_code == 400 and info.value.param == param


# -- files ----------------------------------------------------------------------------------


def test_file_upload_retrieve_content_list_delete(client):
    data = jsonl(sft_examples(3, seed=9))
    created = client.files.create(file=("a.jsonl", data), purpose="fine-tune")
    assert isinstance(created, FileObject)
    assert (created.filename, created.purpose, created.bytes, created.status) == ("a.jsonl", "fine-tune", len(data), "processed")
    assert client.files.retrieve(created.id) == created
    assert client.files.content(created.id).content == data
    others = [client.files.create(file=(f"u{i}.txt", b"hello"), purpose="user_data") for i in range(3)]
    page = client.files.list(purpose="user_data", limit=2)
    assert [f.id for f in page.data] == [others[2].id, others[1].id] and page.has_more
    assert [f.id for f in client.files.list(purpose="user_data", limit=2)] == [o.id for o in reversed(others)]
    assert [f.id for f in client.files.list(purpose="user_data", order="asc")] == [o.id for o in others]
    deleted = client.files.delete(created.id)
    assert deleted.deleted and deleted.id == created.id
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        client.files.content(created.id)


def test_invalid_fine_tune_upload_names_the_line(client):
    data = jsonl(sft_examples(2)) + b'{"messages": [{"role": "user", "content": "no answer"}]}\n'
    with pytest.raises(openai.BadRequestError) as info:
        client.files.create(file=("bad.jsonl", data), purpose="fine-tune")
    assert info.value.code == "invalid_file_format" and info.value.param == "file"
    assert "line 3" in info.value.message
    with pytest.raises(openai.BadRequestError) as info:
        client.files.create(file=("x.jsonl", b"{}"), purpose="weights")
    assert info.value.param == "purpose"


# -- fine-tuning jobs -----------------------------------------------------------------------


def test_supervised_job_lifecycle(client, finished_job, sft_file):
    job = finished_job
    assert isinstance(job, FineTuningJob)
    assert job.status == "succeeded" and job.error is None
    assert re.fullmatch(r"ft:gpt-4o-mini-2024-07-18:org-local:unit:[A-Za-z0-9]{8}", job.fine_tuned_model)
    assert job.trained_tokens > 0 and job.finished_at >= job.created_at
    assert (job.seed, job.training_file, job.metadata) == (42, sft_file.id, {"run_id": "r1", "group": "prover"})
    assert job.hyperparameters.n_epochs == 10 and job.method.supervised.hyperparameters.batch_size == 1
    events = list(client.fine_tuning.jobs.list_events(job.id, limit=7))  # auto-pagination
    assert all(isinstance(e, FineTuningJobEvent) for e in events)
    messages = [e.message for e in reversed(events)]
    assert messages[0] == f"Created fine-tuning job: {job.id}"
    order = ["Validating training file", "Files validated", "Fine-tuning job started", "New fine-tuned model created", "The job has successfully completed"]
    positions = [next(i for i, m in enumerate(messages) if m.startswith(o)) for o in order]
    assert positions == sorted(positions)
    metrics = [e for e in events if e.type == "metrics"]
    assert metrics and metrics[0].data["total_steps"] == 120 and "train_loss" in metrics[0].data
    checkpoints = list(client.fine_tuning.jobs.checkpoints.list(job.id))
    assert all(isinstance(c, FineTuningJobCheckpoint) for c in checkpoints)
    assert [c.step_number for c in checkpoints] == [120, 108, 96]
    assert checkpoints[0].fine_tuned_model_checkpoint == f"{job.fine_tuned_model}:ckpt-step-120"
    assert 0 <= checkpoints[0].metrics.train_mean_token_accuracy <= 1
    (result_file,) = job.result_files
    csv = client.files.content(result_file).text.splitlines()
    assert csv[0].startswith("step,train_loss") and len(csv) == 121
    assert client.files.retrieve(result_file).purpose == "fine-tune-results"
    # the models are usable, listed (not the checkpoints), and answer in the trained format
    assert job.fine_tuned_model in {m.id for m in client.models.list()}
    assert client.models.retrieve(job.fine_tuned_model).owned_by == "org-local"
    for name in (job.fine_tuned_model, checkpoints[-1].fine_tuned_model_checkpoint):
        out = client.chat.completions.create(model=name, messages=sft_examples(12)[0]["messages"][:-1], seed=0)
        assert out.choices[0].message.content.startswith("Answer: ")


def test_fine_tune_of_a_fine_tune_keeps_the_base_name(client, finished_job, sft_file):
    job = client.fine_tuning.jobs.create(model=finished_job.fine_tuned_model, training_file=sft_file.id, suffix="second")
    job = wait_for_job(client, job.id)
    assert job.status == "succeeded" and job.model == finished_job.fine_tuned_model
    assert job.fine_tuned_model.startswith("ft:gpt-4o-mini-2024-07-18:org-local:second:")


def test_dpo_job_and_hyperparameters(client):
    f = client.files.create(file=("dpo.jsonl", jsonl(dpo_examples(10))), purpose="fine-tune")
    job = client.fine_tuning.jobs.create(
        model="gpt-4.1-mini-2025-04-14", training_file=f.id,
        method={"type": "dpo", "dpo": {"hyperparameters": {"beta": 0.2, "n_epochs": 2}}},
    )
    assert job.status == "validating_files" and job.method.dpo.hyperparameters.beta == 0.2
    job = wait_for_job(client, job.id)
    assert job.status == "succeeded"
    assert (job.method.type, job.method.dpo.hyperparameters.n_epochs, job.method.dpo.hyperparameters.batch_size) == ("dpo", 2, 1)
    assert job.fine_tuned_model.startswith("ft:gpt-4.1-mini-2025-04-14:org-local::")


def test_list_jobs_paginates_and_filters_by_metadata(client, sft_file, finished_job):
    created = [
        client.fine_tuning.jobs.create(model="gpt-4o-mini", training_file=sft_file.id, metadata={"run_id": "r2", "i": str(i)})
        for i in range(3)
    ]
    page = client.fine_tuning.jobs.list(limit=2)
    assert [j.id for j in page.data] == [created[2].id, created[1].id] and page.has_more
    nxt = client.fine_tuning.jobs.list(limit=2, after=page.data[-1].id)
    assert nxt.data[0].id == created[0].id
    assert [j.id for j in client.fine_tuning.jobs.list(metadata={"run_id": "r2"}, limit=1)] == [c.id for c in reversed(created)]
    assert [j.id for j in client.fine_tuning.jobs.list(metadata={"run_id": "r2", "i": "1"})] == [created[1].id]
    assert [j.id for j in client.fine_tuning.jobs.list(metadata={"run_id": "r1"})] == [finished_job.id]
    assert list(client.fine_tuning.jobs.list(metadata={"run_id": "none"})) == []
    for job in created:
        client.fine_tuning.jobs.cancel(job.id)


def test_cancel_a_running_job_then_cancel_again_is_400(client):
    f = client.files.create(file=("big.jsonl", jsonl(sft_examples(10, seed=4))), purpose="fine-tune")
    job = client.fine_tuning.jobs.create(model="gpt-4o-mini", training_file=f.id)
    cancelled = client.fine_tuning.jobs.cancel(job.id)
    assert cancelled.status == "cancelled" and cancelled.fine_tuned_model is None
    assert wait_for_job(client, job.id).status == "cancelled"
    with pytest.raises(openai.BadRequestError):
        client.fine_tuning.jobs.cancel(job.id)
    assert any(e.message == "Fine-tuning job cancelled" for e in client.fine_tuning.jobs.list_events(job.id))


@pytest.mark.parametrize(
    ("examples", "method", "code", "fragment"),
    [
        (dpo_examples(10), {"type": "supervised"}, "invalid_training_file", "line 1"),
        (sft_examples(4), {"type": "supervised"}, "invalid_n_examples", "at least 10 examples"),
    ],
)
def test_bad_training_files_fail_the_job(client, examples, method, code, fragment):
    f = client.files.create(file=("t.jsonl", jsonl(examples)), purpose="fine-tune")
    job = wait_for_job(client, client.fine_tuning.jobs.create(model="gpt-4o-mini", training_file=f.id, method=method).id)
    assert job.status == "failed" and job.fine_tuned_model is None
    assert job.error.code == code and fragment in job.error.message and job.error.param == "training_file"
    assert [e.level for e in client.fine_tuning.jobs.list_events(job.id, limit=1).data] == ["error"]


def test_job_creation_errors(client, sft_file):
    long_suffix = "s" * 65
    cases = [
        ({"model": "gpt-9"}, "model"),
        ({"suffix": long_suffix}, "suffix"),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
        ({"training_file": "file-missing"}, "training_file"),
        ({"method": {"type": "reinforcement"}}, "method.type"),
        ({"hyperparameters": {"n_epochs": 0}}, "hyperparameters.n_epochs"),
    ]
    for override, param in cases:
        kwargs = {"model": "gpt-4o-mini", "training_file": sft_file.id, **override}
        with pytest.raises(openai.BadRequestError) as info:
            client.fine_tuning.jobs.create(**kwargs)
        assert info.value.param == param, (override, info.value.message)
    assert client.fine_tuning.jobs.create(model="gpt-4o-mini", training_file=sft_file.id, suffix="s" * 64).status == "validating_files"
    with pytest.raises(openai.NotFoundError):
        client.fine_tuning.jobs.retrieve("ftjob-missing")
    with pytest.raises(openai.NotFoundError):
        list(client.fine_tuning.jobs.list_events("ftjob-missing"))
    with pytest.raises(openai.NotFoundError):
        client.fine_tuning.jobs.cancel("ftjob-missing")


def test_delete_fine_tuned_model(client, sft_file):
    job = wait_for_job(client, client.fine_tuning.jobs.create(model="gpt-3.5-turbo", training_file=sft_file.id).id)
    assert client.models.delete(job.fine_tuned_model).deleted
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve(job.fine_tuned_model)
    with pytest.raises(openai.PermissionDeniedError):
        client.models.delete("gpt-3.5-turbo")

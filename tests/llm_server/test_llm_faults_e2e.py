"""Injected faults: the openai client's retries get every request through."""

from __future__ import annotations

import openai
import pytest

from nipflow_llm_server.testing import local_api_server
from tests.llm_server.llm_helpers import jsonl, sft_examples, verifier_system

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TWENTY_PERCENT = {"seed": 7, "endpoints": {"*": {"rate_429": 0.1, "rate_500": 0.1, "retry_after_s": 0.02}}}
MESSAGES = [{"role": "system", "content": verifier_system("sum", "print(sum(map(int, input().split())))")}]


@pytest.fixture(scope="module")
def faulty_server(tmp_path_factory):
    with local_api_server(tmp_path_factory.mktemp("faulty"), job_time_scale=0.02, faults=TWENTY_PERCENT) as server:
        yield server


def test_every_request_gets_through_20_percent_429_and_500(faulty_server):
    client = faulty_server.client(max_retries=8)
    texts = [client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, seed=i).choices[0].message.content for i in range(60)]
    assert len(texts) == 60 and all(texts)
    f = client.files.create(file=("t.jsonl", jsonl(sft_examples(10))), purpose="fine-tune")
    job = client.fine_tuning.jobs.create(model="gpt-4o-mini", training_file=f.id)
    assert client.fine_tuning.jobs.retrieve(job.id).id == job.id
    assert [j.id for j in client.fine_tuning.jobs.list()] == [job.id]
    assert len(list(client.models.list())) >= 10
    assert len(client.files.list().data) == 1  # the upload happened once, despite retries
    injected = faulty_server.fault_status()["injected"]
    assert injected.get("chat.completions:429", 0) >= 3 and injected.get("chat.completions:500", 0) >= 3


def test_faults_are_repeatable_for_a_seed(faulty_server):
    client = faulty_server.client(max_retries=0)
    config = {"seed": 3, "endpoints": {"models": {"rate_429": 0.3, "rate_503": 0.2, "retry_after_s": 0.01}}}

    def pattern() -> list[str]:
        faulty_server.set_faults(config)
        out = []
        for _ in range(30):
            try:
                client.models.retrieve("gpt-4o-mini")
                out.append("ok")
            except openai.RateLimitError as exc:
                assert exc.response.headers["retry-after"] == "0.01" and exc.code == "rate_limit_exceeded"
                out.append("429")
            except openai.InternalServerError as exc:
                out.append(str(exc.status_code))
        return out

    first = pattern()
    assert first == pattern()
    assert {"ok", "429", "503"} == set(first)


def test_dropped_and_slow_requests_are_retried(faulty_server):
    faulty_server.set_faults({"seed": 1, "endpoints": {"chat.completions": {"rate_drop": 0.2, "rate_slow": 0.5, "slow_ms": 20}}})
    client = faulty_server.client(max_retries=8)
    texts = [client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES).choices[0].message.content for _ in range(6)]
    assert all(texts)
    injected = faulty_server.fault_status()["injected"]
    assert injected["chat.completions:drop"] >= 1 and injected["chat.completions:slow"] >= 1
    with pytest.raises(openai.APIConnectionError):
        faulty_server.set_faults({"endpoints": {"chat.completions": {"rate_drop": 1.0}}})
        faulty_server.client(max_retries=0).chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)
    faulty_server.clear_faults()
    assert faulty_server.client(max_retries=0).chat.completions.create(model="gpt-4o-mini", messages=MESSAGES).choices

"""In-process checks of the engine layer: the tiny model, the batching queue, options,
the capability check (against a stand-in for the OpenAI API, which cannot be reached here)
and the refusal of ``--engine vllm`` where vLLM cannot run."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import openai
import pytest
import torch

from nip_core.llm.capabilities import ModelNotFineTunableError, OpenAIFineTuningEndWarning, check_fine_tunable
from nipflow_llm_server.engines.base import Generation, SamplingParams
from nipflow_llm_server.engines.batching import Batcher
from nipflow_llm_server.engines.generation import DecodeBatch, generate_rows, make_rows
from nipflow_llm_server.engines.tiny import build_tiny_model, build_tokenizer, parameter_count
from nipflow_llm_server.engines.trl_training import encode_prompt
from nipflow_llm_server.engines.vllm_engine import WholeBatch
from nipflow_llm_server.server.config import ServerConfig

REPO = Path(__file__).resolve().parents[4]


def test_byte_tokenizer_round_trips_any_text_and_renders_the_chat_template():
    tok = build_tokenizer()
    text = "héllo\n\t✓ 42"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids == list(text.encode("utf-8")) and tok.decode(ids) == text
    assert (tok.pad_token_id, tok.convert_tokens_to_ids("<|im_start|>"), tok.eos_token_id) == (256, 257, 258)
    messages = [{"role": "system", "content": "Decide."}, {"role": "user", "name": "Prover", "content": "x = 1"}]
    rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == ("<|im_start|>system\nDecide.<|im_end|>\n<|im_start|>user Prover\nx = 1<|im_end|>\n"
                        "<|im_start|>assistant\n")
    assert encode_prompt(tok, messages) == tok(rendered, add_special_tokens=False)["input_ids"]


def test_the_tiny_model_is_a_few_million_parameters_with_seeded_weights():
    a, b = build_tiny_model(), build_tiny_model()
    assert 2_000_000 < parameter_count(a) < 6_000_000
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    before = torch.random.get_rng_state()
    build_tiny_model()
    assert torch.equal(before, torch.random.get_rng_state())  # the global stream is left alone


def test_a_long_prompt_loses_its_start_to_fit_the_context():
    rows, used = make_rows(list(range(100)), SamplingParams(max_tokens=30, n=2), context=64)
    assert used == 34 and rows[0].prompt == list(range(66, 100)) and rows[0].max_new == 30 and len(rows) == 2


def test_concurrent_requests_are_generated_together_and_a_row_does_not_depend_on_its_batch():
    tok, model = build_tokenizer(), build_tiny_model()
    prompts = [encode_prompt(tok, [{"role": "user", "content": "question " * k}]) for k in range(1, 6)]

    def rows_of(k: int):
        return make_rows(prompts[k], SamplingParams(seed=k, max_tokens=12, temperature=1.0), 4096)[0]

    alone = [generate_rows(model, tok, rows_of(k), "cpu")[0].text for k in range(5)]
    batcher = Batcher(window_s=0.2, max_batch=8)

    async def together():
        batch = lambda: DecodeBatch(model, tok, "cpu")  # noqa: E731
        return await asyncio.gather(*[batcher.submit("tiny", rows_of(k), batch) for k in range(5)])

    try:
        results = asyncio.run(together())
    finally:
        batcher.stop()
    assert batcher.batch_sizes == [5]  # five requests of different lengths, one padded batch
    assert [r[0].text for r in results] == alone


def _staggered_rows(tok, k: int, max_tokens: int, n: int = 1):
    prompt = encode_prompt(tok, [{"role": "user", "content": "turn " * (k + 1)}])
    return make_rows(prompt, SamplingParams(seed=k, max_tokens=max_tokens, temperature=1.0, n=n), 4096)[0]


def test_rows_join_a_batch_between_steps_and_leave_it_when_they_finish():
    tok, model = build_tokenizer(), build_tiny_model()
    requests = [(0, 30), (1, 4), (2, 9), (3, 30)]  # (seed and prompt length, max_tokens)
    alone = [generate_rows(model, tok, _staggered_rows(tok, *r), "cpu")[0] for r in requests]
    assert all(g.finish_reason == "length" for g in alone)  # each runs to its limit
    batch, texts, sizes = DecodeBatch(model, tok, "cpu"), {}, []
    batch.admit(_staggered_rows(tok, *requests[0]), [0])
    step = -1
    while len(batch):
        step += 1
        if step in (3, 5):  # requests 1 and 2 join request 0's batch, then 3 joins with rows of different ages
            joining = (1, 2) if step == 3 else (3,)
            batch.admit([_staggered_rows(tok, *requests[k])[0] for k in joining], list(joining))
        for r in batch.step():
            texts[r.owner] = (step, r.generation(batch.decode).text)
        sizes.append(len(batch))
    assert [texts[k][1] for k in range(4)] == [g.text for g in alone]  # joining midway changes no row
    # request 1 ends at the step of its 4th token (3 + 3), request 2 at its 9th, each leaving at once
    # each leaves at the step of its last token: request 1 at 3 + 3, 2 at 3 + 8, 0 at 29, 3 at 5 + 29
    assert [texts[k][0] for k in range(4)] == [29, 6, 11, 34]
    assert sizes[:7] == [1, 1, 1, 3, 3, 4, 3] and sizes[11] == 2 and sizes[29] == 1 and len(sizes) == 35


def test_a_request_is_answered_when_its_own_rows_finish():
    tok, model = build_tokenizer(), build_tiny_model()
    batcher = Batcher(window_s=0.0, max_batch=8)
    finished: list[int] = []

    async def staggered():
        batch = lambda: DecodeBatch(model, tok, "cpu")  # noqa: E731

        async def ask(k: int, max_tokens: int, n: int = 1):
            result = await batcher.submit("tiny", _staggered_rows(tok, k, max_tokens, n), batch)
            finished.append(k)
            return result

        long_one = asyncio.ensure_future(ask(0, 200))
        while not batcher.batch_sizes:  # request 0 is being decoded
            await asyncio.sleep(0.01)
        short = await asyncio.gather(ask(1, 3), ask(2, 5, n=2))
        assert not long_one.done()  # answered while request 0 still had most of its 200 tokens to go
        return short, await long_one

    try:
        (short, long_one) = asyncio.run(staggered())
    finally:
        batcher.stop()
    assert finished == [1, 2, 0] or finished == [2, 1, 0]  # not held back by request 0's 200 tokens
    assert [g.completion_tokens for g in short[1]] == [5, 5] and long_one[0].completion_tokens == 200
    assert batcher.batch_sizes[0] == 1 and max(batcher.batch_sizes) >= 2  # the short ones joined the long one


def test_rows_dropped_midway_leave_the_others_as_they_would_have_been():
    tok, model = build_tokenizer(), build_tiny_model()
    alone = [generate_rows(model, tok, _staggered_rows(tok, k, 20), "cpu")[0].text for k in range(4)]
    batch = DecodeBatch(model, tok, "cpu")
    batch.admit([_staggered_rows(tok, k, 20)[0] for k in range(4)], list(range(4)))
    for _ in range(5):
        assert batch.step() == []
    width = batch.attention.shape[1]
    assert batch.drop(lambda owner: owner in (1, 3)) == 2 and len(batch) == 2  # 3: the longest prompt
    assert batch.attention.shape[1] < width and batch.cache.layers[0].keys.shape[0] == 2
    assert batch.drop(lambda owner: owner in (1, 3)) == 0
    texts = {}
    while len(batch):
        texts.update({r.owner: r.generation(batch.decode).text for r in batch.step()})
    assert texts == {0: alone[0], 2: alone[2]}
    batch.admit([_staggered_rows(tok, 1, 20)[0]], [1])
    assert batch.drop(lambda owner: True) == 1 and len(batch) == 0 and batch.cache is None and batch.step() == []


def test_a_request_nobody_waits_for_leaves_the_batch_unfinished():
    """A cancelled request (the chat route cancels it when its client disconnects) is not
    decoded to its end beside the others."""
    tok, model = build_tokenizer(), build_tiny_model()
    greedy = encode_prompt(tok, [{"role": "user", "content": "turn "}])
    endless = make_rows(greedy, SamplingParams(temperature=0, max_tokens=900, n=3), 1024)[0]  # ~7 s to its limit
    alone = generate_rows(model, tok, _staggered_rows(tok, 1, 40), "cpu")[0].text
    batcher = Batcher(window_s=0.0, max_batch=8)

    async def scenario():
        batch = lambda: DecodeBatch(model, tok, "cpu")  # noqa: E731
        abandoned = asyncio.ensure_future(batcher.submit("tiny", endless, batch))
        while not batcher.batch_sizes:
            await asyncio.sleep(0.01)
        kept = asyncio.ensure_future(batcher.submit("tiny", _staggered_rows(tok, 1, 40), batch))
        while len(batcher.batch_sizes) < 2:  # joined the three endless rows
            await asyncio.sleep(0.01)
        abandoned.cancel()
        answer = await kept
        for _ in range(500):
            if batcher.dropped_rows:
                break
            await asyncio.sleep(0.01)
        return answer

    try:
        answer = asyncio.run(scenario())
    finally:
        batcher.stop()
    assert batcher.batch_sizes[:2] == [3, 4] and batcher.dropped_rows == 3
    assert answer[0].text == alone


def test_whole_row_generation_runs_through_the_batching_queue():
    """The vLLM engine's path (vLLM itself cannot run here): rows admitted together are
    generated by one call, each request gets its own, and a request abandoned while it waits
    is never generated."""
    calls: list[list[str]] = []
    release = threading.Event()

    def generate(rows):
        calls.append(list(rows))
        release.wait(10)
        return [Generation(text=row.upper(), finish_reason="stop", completion_tokens=1) for row in rows]

    batcher = Batcher(window_s=0.05, max_batch=8)

    async def scenario():
        whole = lambda: WholeBatch(generate)  # noqa: E731
        first = [asyncio.ensure_future(batcher.submit("vllm", rows, whole)) for rows in (["a", "b"], ["c"])]
        while not calls:  # "a", "b", "c" are being generated
            await asyncio.sleep(0.01)
        abandoned = asyncio.ensure_future(batcher.submit("vllm", ["x"], whole))
        later = asyncio.ensure_future(batcher.submit("vllm", ["d"], whole))
        await asyncio.sleep(0.1)
        abandoned.cancel()
        release.set()
        return await asyncio.gather(*first, later)

    try:
        answers = asyncio.run(scenario())
    finally:
        batcher.stop()
    assert [[g.text for g in a] for a in answers] == [["A", "B"], ["C"], ["D"]]
    assert calls == [["a", "b", "c"], ["d"]]


def test_stop_strings_and_token_limits_end_a_row():
    tok, model = build_tokenizer(), build_tiny_model()
    prompt = encode_prompt(tok, [{"role": "user", "content": "hi"}])
    free = generate_rows(model, tok, make_rows(prompt, SamplingParams(seed=3, max_tokens=20), 4096)[0], "cpu")[0]
    assert free.finish_reason == "length" and free.completion_tokens == 20
    stop = free.text[5:8]
    cut = generate_rows(model, tok, make_rows(prompt, SamplingParams(seed=3, max_tokens=20, stop=(stop,)), 4096)[0],
                        "cpu")[0]
    assert cut.finish_reason == "stop" and cut.text == free.text[: free.text.find(stop)]


def test_engine_options_are_refused_by_engines_that_do_not_use_them(tmp_path):
    with pytest.raises(ValueError, match="--device is not used by --engine selection"):
        ServerConfig(data_dir=tmp_path, device="cpu")
    with pytest.raises(ValueError, match="--full-fine-tune is not used by --engine vllm"):
        ServerConfig(data_dir=tmp_path, engine="vllm", full_fine_tune=True)
    with pytest.raises(ValueError, match="--device must be"):
        ServerConfig(data_dir=tmp_path, engine="transformers", device="tpu")
    assert ServerConfig(data_dir=tmp_path, engine="transformers", base_models=["x=/m"]).base_models == ["x=/m"]


def test_engine_vllm_without_vllm_or_gpu_is_refused_naming_the_flag(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "nipflow_llm_server.server", "--engine", "vllm", "--port", "0", "--data-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )
    assert proc.returncode == 2, proc.stderr
    assert "--engine vllm" in proc.stderr and ("vllm" in proc.stderr.split("--engine vllm", 1)[1])
    assert not (tmp_path / "server.lock").exists()  # refused before taking the data directory


def test_a_base_model_that_is_not_there_is_refused_offline(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "nipflow_llm_server.server", "--engine", "transformers", "--port", "0",
         "--data-dir", str(tmp_path), "--base-model", "no-such-org/no-such-model"],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )
    assert proc.returncode == 2
    assert "--base-model 'no-such-org/no-such-model'" in proc.stderr and "--allow-download" in proc.stderr


# -- the capability check against the OpenAI API (a stand-in: no network here) ----------------

OPENAI_URL = "https://api.openai.com/v1/"
OPENAI_MODELS = ["gpt-4o-mini-2024-07-18", "gpt-4.1-mini-2025-04-14", "gpt-4o-2024-08-06",
                 "ft:gpt-4.1-mini-2025-04-14:org:x:abc123"]


def _openai_standin() -> openai.OpenAI:
    """A client whose transport answers ``GET /v1/models`` as OpenAI does: no capability fields."""

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/models"
        data = [{"id": m, "object": "model", "created": 1, "owned_by": "system"} for m in OPENAI_MODELS]
        return httpx.Response(200, json={"object": "list", "data": data})

    return openai.OpenAI(api_key="sk-test", base_url=OPENAI_URL, max_retries=0,
                         http_client=httpx.Client(transport=httpx.MockTransport(handler)))


def test_openai_table_refuses_dpo_on_gpt_4o_mini_and_warns_about_the_end_of_jobs():
    client = _openai_standin()
    with pytest.warns(OpenAIFineTuningEndWarning, match="2027-01-06"):
        with pytest.raises(ModelNotFineTunableError) as info:
            check_fine_tunable(client, "gpt-4o-mini-2024-07-18", "dpo")
    message = str(info.value)
    assert "gpt-4o-mini-2024-07-18" in message and "'dpo'" in message and OPENAI_URL in message
    assert "gpt-4.1-mini-2025-04-14" in message  # says where DPO is offered
    with pytest.warns(OpenAIFineTuningEndWarning):
        assert check_fine_tunable(client, "gpt-4o-mini-2024-07-18", "supervised") == {"supervised": True, "dpo": False}
        assert check_fine_tunable(client, "ft:gpt-4.1-mini-2025-04-14:org:x:abc123", "dpo")["dpo"] is True


def test_openai_table_refuses_unknown_and_unlisted_models():
    client = _openai_standin()
    with pytest.warns(OpenAIFineTuningEndWarning):
        with pytest.raises(ModelNotFineTunableError, match="does not list this model"):
            check_fine_tunable(client, "gpt-5-imaginary", "supervised")
        with pytest.raises(ModelNotFineTunableError, match="not a fine-tunable base in the OpenAI table"):
            check_fine_tunable(client, "gpt-4o-2024-08-06", "supervised")
    with pytest.raises(ModelNotFineTunableError, match="unknown method"):
        check_fine_tunable(client, "gpt-4o-mini-2024-07-18", "reinforcement")


def test_capability_fields_of_a_server_decide_without_the_table():
    def handler(request: httpx.Request) -> httpx.Response:
        caps = {"fine_tuning": {"supervised": True, "dpo": False}}
        return httpx.Response(200, json={"object": "list", "data": [
            {"id": "m1", "object": "model", "created": 1, "owned_by": "system", "capabilities": caps}]})

    client = openai.OpenAI(api_key="k", base_url="http://127.0.0.1:9/v1", max_retries=0,
                           http_client=httpx.Client(transport=httpx.MockTransport(handler)))
    assert check_fine_tunable(client, "m1", "supervised") == {"supervised": True, "dpo": False}
    with pytest.raises(ModelNotFineTunableError, match="offers these methods for it: supervised"):
        check_fine_tunable(client, "m1", "dpo")
    assert json.dumps(check_fine_tunable(client, "m1", "supervised"))  # plain data

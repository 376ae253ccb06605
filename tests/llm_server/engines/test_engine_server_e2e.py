"""``nipflow api-server --engine transformers`` serving ``nipflow-tiny-lm``, through the
official ``openai`` client: models and capabilities, sampling options, SFT and DPO jobs
trained with TRL whose adapters are served at once, and the capability check."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from nip_core.llm.capabilities import ModelNotFineTunableError, check_fine_tunable
from nipflow_llm_server.engines.tiny import build_tokenizer
from nipflow_llm_server.engines.transformers_engine import TransformersEngine
from nipflow_llm_server.launcher import LOG_FILE
from nipflow_llm_server.engines.trl_training import completion_logprob
from tests.llm_server.engines.engine_helpers import (
    clue_examples, greedy_hits, jsonl, preference_examples, wait_for_job,
)

pytestmark = [pytest.mark.e2e]
TINY = "nipflow-tiny-lm"
PROMPT = [{"role": "system", "content": "Decide."}, {"role": "user", "name": "Prover", "content": "x = 1"}]


def test_models_keep_openai_fields_and_add_capabilities(tiny_client):
    models = {m.id: m for m in tiny_client.models.list()}
    tiny = models[TINY]
    assert (tiny.object, tiny.owned_by) == ("model", "system") and isinstance(tiny.created, int)
    assert tiny.model_extra["capabilities"] == {"fine_tuning": {"supervised": True, "dpo": True},
                                                "structured_output": True}
    assert tiny.model_extra["engine"] == "transformers"
    assert tiny_client.models.retrieve(TINY).model_extra["capabilities"]["fine_tuning"]["dpo"] is True


def test_seed_n_max_tokens_and_usage(tiny_client):
    def ask(**kw):
        return tiny_client.chat.completions.create(model=TINY, messages=PROMPT, **kw)

    a, b, c = ask(seed=7, max_tokens=12), ask(seed=7, max_tokens=12), ask(seed=8, max_tokens=12)
    assert a.choices[0].message.content == b.choices[0].message.content != c.choices[0].message.content
    assert a.choices[0].finish_reason == "length" and a.usage.completion_tokens == 12
    rendered = build_tokenizer().apply_chat_template(PROMPT, tokenize=False, add_generation_prompt=True)
    specials = rendered.count("<|im_start|>") + rendered.count("<|im_end|>")
    plain = rendered.replace("<|im_start|>", "").replace("<|im_end|>", "")
    assert a.usage.prompt_tokens == len(plain.encode("utf-8")) + specials == 48  # a token per byte or special
    many = ask(seed=7, max_tokens=5, n=3)
    assert [ch.index for ch in many.choices] == [0, 1, 2]
    assert len({ch.message.content for ch in many.choices}) == 3
    assert many.usage.completion_tokens == 15 and many.usage.total_tokens == many.usage.prompt_tokens + 15


def test_stop_cuts_the_reply_before_the_stop_string(tiny_client):
    free = tiny_client.chat.completions.create(model=TINY, messages=PROMPT, seed=3, max_tokens=24)
    text = free.choices[0].message.content
    stop = next(text[i:i + 2] for i in range(4, len(text) - 2) if "\ufffd" not in text[i:i + 2])
    cut = tiny_client.chat.completions.create(model=TINY, messages=PROMPT, seed=3, max_tokens=24, stop=[stop])
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].message.content == text[: text.find(stop)]


def test_concurrent_requests_get_the_answers_they_get_alone(tiny_client):
    prompts = [[{"role": "user", "content": "word " * k}] for k in range(1, 7)]

    def ask(k: int) -> str:
        resp = tiny_client.chat.completions.create(model=TINY, messages=prompts[k], seed=k, max_tokens=10)
        return resp.choices[0].message.content

    alone = [ask(k) for k in range(6)]
    with ThreadPoolExecutor(6) as pool:
        together = list(pool.map(ask, range(6)))
    assert together == alone


def test_a_client_that_times_out_has_its_rows_dropped_not_decoded_to_the_end(tiny_server):
    """The official client gives up after 2 s on 3 greedy rows of 900 tokens (about 7 s): the
    server sees the disconnect, cancels the request and drops its rows from the batch."""
    log_file = tiny_server.data_dir / LOG_FILE
    start = log_file.stat().st_size
    impatient = tiny_server.client(max_retries=0, timeout=2.0)
    with pytest.raises(openai.APITimeoutError):
        impatient.chat.completions.create(model=TINY, messages=[{"role": "user", "content": "turn "}], n=3,
                                          temperature=0, max_tokens=900)
    lines: list[str] = []
    for _ in range(300):
        lines = log_file.read_text()[start:].splitlines()
        if any("left the batch unfinished" in line for line in lines):
            break
        time.sleep(0.1)
    assert any("chat completion abandoned: its client disconnected" in line for line in lines), lines
    assert any("3 sequences of 1 requests nobody waits for" in line for line in lines), lines
    patient = tiny_server.client(max_retries=0, timeout=60.0)
    reply = patient.chat.completions.create(model=TINY, messages=PROMPT, seed=1, max_tokens=8)
    assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 8


def test_capability_check_against_the_server(tiny_server, tiny_client):
    assert check_fine_tunable(tiny_client, TINY, "dpo") == {"supervised": True, "dpo": True}
    with pytest.raises(ModelNotFineTunableError) as info:
        check_fine_tunable(tiny_client, "gpt-4o-mini-2024-07-18", "supervised")  # a selection-engine name
    assert "gpt-4o-mini-2024-07-18" in str(info.value) and tiny_server.base_url in str(info.value)


@pytest.mark.slow
def test_sft_job_moves_greedy_answers_to_the_targets_and_is_served_without_restart(tiny_client):
    examples = clue_examples(24, seed=3)
    f = tiny_client.files.create(file=("sft.jsonl", jsonl(examples)), purpose="fine-tune")
    job = tiny_client.fine_tuning.jobs.create(
        model=TINY, training_file=f.id, validation_file=f.id, seed=1, suffix="clues",
        method={"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 8, "batch_size": 2}}})
    job = wait_for_job(tiny_client, job.id)
    assert job.status == "succeeded", job.error
    assert job.fine_tuned_model.startswith(f"ft:{TINY}:org-local:clues:")
    assert job.hyperparameters.n_epochs == 8 and job.trained_tokens > 0
    assert job.fine_tuned_model in {m.id for m in tiny_client.models.list()}  # same server, no restart
    base_hits = greedy_hits(tiny_client, TINY, examples)
    tuned_hits = greedy_hits(tiny_client, job.fine_tuned_model, examples)
    print(f"SFT (transformers engine): targets answered greedily {base_hits}/24 by the base model, "
          f"{tuned_hits}/24 after fine-tuning; job {job.finished_at - job.created_at} s (8 epochs, 96 steps, CPU)")
    assert base_hits == 0 and tuned_hits >= 0.9 * 24
    events = list(tiny_client.fine_tuning.jobs.list_events(job.id, limit=200))
    losses = [e.data["train_loss"] for e in reversed(events) if e.type == "metrics"]
    assert losses[-1] < 0.1 * losses[0]  # the loss TRL reported fell
    checkpoints = list(tiny_client.fine_tuning.jobs.checkpoints.list(job.id))
    assert [c.step_number for c in checkpoints] == [96, 84, 72]  # the last three epochs of 12 steps
    assert all(c.metrics.full_valid_loss is not None for c in checkpoints)


@pytest.mark.slow
def test_dpo_job_raises_the_preferred_margin(tiny_server, tiny_client):
    examples = preference_examples(16, seed=5)
    f = tiny_client.files.create(file=("dpo.jsonl", jsonl(examples)), purpose="fine-tune")
    job = tiny_client.fine_tuning.jobs.create(model=TINY, training_file=f.id, seed=2,
                                              method={"type": "dpo", "dpo": {"hyperparameters": {"beta": 0.1, "n_epochs": 6}}})
    job = wait_for_job(tiny_client, job.id)
    assert job.status == "succeeded", job.error
    assert job.method.dpo.hyperparameters.beta == 0.1 and job.hyperparameters.n_epochs == 6
    # log-probabilities are not on the chat API: load what the server saved and measure it
    engine = TransformersEngine(device="cpu")
    base = engine.load_base(TINY)
    tuned = engine.load(job.fine_tuned_model, TINY, tiny_server.data_dir, f"models/{job.id}/final", "")

    def margins(lm) -> list[float]:
        return [completion_logprob(lm.model, lm.tokenizer, e["input"]["messages"], e["preferred_output"][0]["content"])
                - completion_logprob(lm.model, lm.tokenizer, e["input"]["messages"],
                                     e["non_preferred_output"][0]["content"]) for e in examples]

    before, after = margins(base), margins(tuned)
    mean_before, mean_after = sum(before) / 16, sum(after) / 16
    won_before, won_after = sum(m > 0 for m in before), sum(m > 0 for m in after)
    print(f"DPO (transformers engine): mean preferred-minus-rejected log-prob margin {mean_before:.2f} -> "
          f"{mean_after:.2f}, pairs preferring the preferred {won_before}/16 -> {won_after}/16; "
          f"job {job.finished_at - job.created_at} s (6 epochs, 96 steps, CPU)")
    assert mean_before < 1.0 and mean_after > mean_before + 10.0
    assert won_before <= 10 and won_after == 16
    assert job.fine_tuned_model in {m.id for m in tiny_client.models.list()}  # served at once
    replies = [tiny_client.chat.completions.create(model=m, messages=examples[0]["input"]["messages"], temperature=0,
                                                   max_tokens=8).choices[0].message.content
               for m in (TINY, job.fine_tuned_model)]
    assert replies[0] != replies[1]  # the new weights answer, not the base's

"""Fine-tuning through the server changes what the model answers (SFT and DPO)."""

from __future__ import annotations

import random

import pytest

from nipflow_llm_server.policy.candidates import generate_candidates
from nipflow_llm_server.policy.formats import detect_format
from tests.llm_server.llm_helpers import dpo_examples, jsonl, make_code, make_problem, prover_system, wait_for_job

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
SAMPLES = 4


def _sft_examples(n: int, seed: int) -> list[dict]:
    """Prover turns whose target is one of the base model's own candidates (so the base
    model hits it by chance about 1 time in 20)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        prompt = [
            {"role": "system", "content": prover_system(make_problem(rng), make_code(rng), rng.choice(["accept", "reject"]))},
            {"role": "user", "name": "Verifier", "content": f"Question for Expert: is line {rng.randint(1, 8)} right?"},
        ]
        target = rng.choice(generate_candidates(detect_format(prompt))).text
        out.append({"messages": [*prompt, {"role": "assistant", "content": target}]})
    return out


def _answers(client, model: str, prompts: list[list[dict]]) -> list[list[str]]:
    """``SAMPLES`` seeded answers of ``model`` to each prompt."""
    out = []
    for k, prompt in enumerate(prompts):
        resp = client.chat.completions.create(model=model, messages=prompt, n=SAMPLES, seed=k, temperature=1.0)
        out.append([c.message.content for c in resp.choices])
    return out


def _hits(answers: list[list[str]], targets: list[str]) -> int:
    return sum(a == t for many, t in zip(answers, targets) for a in many)


def test_sft_makes_the_model_answer_its_training_targets(client):
    examples = _sft_examples(40, seed=11)
    f = client.files.create(file=("sft.jsonl", jsonl(examples)), purpose="fine-tune")
    job = wait_for_job(client, client.fine_tuning.jobs.create(model="gpt-4o-mini", training_file=f.id, seed=1).id)
    assert job.status == "succeeded"
    prompts = [e["messages"][:-1] for e in examples]
    targets = [e["messages"][-1]["content"] for e in examples]
    total = SAMPLES * len(examples)
    base = _hits(_answers(client, "gpt-4o-mini", prompts), targets)
    tuned = _hits(_answers(client, job.fine_tuned_model, prompts), targets)
    print(f"SFT: training targets answered {base}/{total} by the base model, {tuned}/{total} after fine-tuning")
    assert base <= 0.15 * total
    assert tuned >= 0.8 * total


def test_dpo_makes_preferred_outputs_far_more_likely(client):
    examples = dpo_examples(30, seed=12)
    f = client.files.create(file=("dpo.jsonl", jsonl(examples)), purpose="fine-tune")
    job = client.fine_tuning.jobs.create(model="gpt-4o-mini", training_file=f.id, seed=2, method={"type": "dpo"})
    job = wait_for_job(client, job.id)
    assert job.status == "succeeded"
    prompts = [e["input"]["messages"] for e in examples]
    preferred = [e["preferred_output"][0]["content"] for e in examples]
    rejected = [e["non_preferred_output"][0]["content"] for e in examples]
    total = SAMPLES * len(examples)
    base = _answers(client, "gpt-4o-mini", prompts)
    tuned = _answers(client, job.fine_tuned_model, prompts)
    base_w, base_l = _hits(base, preferred), _hits(base, rejected)
    tuned_w, tuned_l = _hits(tuned, preferred), _hits(tuned, rejected)
    print(f"DPO: preferred/non-preferred of {total}: base {base_w}/{base_l}, fine-tuned {tuned_w}/{tuned_l}")
    assert base_w + base_l == tuned_w + tuned_l == total  # decisions only at this point
    assert 0.3 * total <= base_w <= 0.7 * total
    assert tuned_w >= 0.9 * total and tuned_l <= 0.1 * total

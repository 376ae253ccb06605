"""The local model family in-process: formats, candidates, sampling, logprobs, training."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from nipflow_llm_server.policy.candidates import generate_candidates
from nipflow_llm_server.policy.formats import detect_format
from nipflow_llm_server.policy.model import PolicyModel, softmax
from nipflow_llm_server.policy.tokenizer import count_tokens, split_tokens
from nipflow_llm_server.policy.training import resolve_hyperparameters, train
from tests.llm_server.llm_helpers import dpo_examples, make_code, make_problem, sft_examples, verifier_system

CODE = "n = int(input())\nfor i in range(n):\n    total += i * 2\nprint(total)"


def sys(text: str) -> dict:
    return {"role": "system", "content": text}


def test_tokens_concatenate_back_to_the_text():
    text = "Answer: the loop `for i in range(n)` is   fine.\n\nYes!  "
    tokens = split_tokens(text)
    assert "".join(tokens) == text
    assert tokens[:3] == ["Answer", ":", " the"]
    assert count_tokens(text) == len(tokens) == 19


def test_verifier_prompt_offers_questions_and_decisions():
    fmt = detect_format([sys(f"Ask 'Question for Expert: ...' then 'Decision: accept' or 'Decision: reject'.\n```python\n{CODE}\n```")])
    assert fmt.question_headers == ("Question for Expert:",)
    assert fmt.decision and not fmt.answer and not fmt.must_decide
    texts = [c.text for c in generate_candidates(fmt)]
    assert texts[:2] == ["Decision: accept", "Decision: reject"]
    assert all(t.startswith("Question for Expert: ") for t in texts[2:])
    # three code lines are quoted in fenced blocks
    assert sum("```python\n" in t for t in texts) == 9
    assert fmt.code_lines == ("n = int(input())", "for i in range(n):", "print(total)")


def test_last_round_message_restricts_to_decisions():
    messages = [
        sys("Ask 'Question for Expert: ...' or answer 'Decision: accept' / 'Decision: reject'."),
        {"role": "user", "name": "Expert", "content": "Answer: fine."},
        sys("You cannot ask any more questions. You must now make a decision."),
    ]
    fmt = detect_format(messages)
    assert fmt.must_decide
    assert [c.text for c in generate_candidates(fmt)] == ["Decision: accept", "Decision: reject"]


def test_debate_headers_give_one_line_per_expert():
    fmt = detect_format([sys("Write 'Question for Expert_1: ...' and 'Question for Expert_2: ...' on two lines.")])
    assert fmt.question_headers == ("Question for Expert_1:", "Question for Expert_2:")
    for cand in generate_candidates(fmt):
        lines = cand.text.split("\n")
        assert lines[0].startswith("Question for Expert_1: ") and lines[1].startswith("Question for Expert_2: ")


@pytest.mark.parametrize("stance", ["accept", "reject"])
def test_prover_argues_its_stance(stance):
    fmt = detect_format([sys(f"Convince the Verifier to {stance} the code. Start with 'Answer: '.\n```python\n{CODE}\n```")])
    assert fmt.answer and fmt.stance == stance
    cands = generate_candidates(fmt)
    assert cands and all(c.text.startswith("Answer: ") and c.template.startswith(f"answer:{stance}") for c in cands)


def test_unmarked_prompt_gives_generic_replies():
    fmt = detect_format([{"role": "user", "content": "hello"}])
    assert not fmt.marked
    assert "Understood." in [c.text for c in generate_candidates(fmt)]


def test_sampling_is_deterministic_given_a_seed_and_greedy_at_temperature_zero():
    model = PolicyModel.base_model("gpt-4o-mini")
    messages = [sys(verifier_system("sum the numbers", CODE))]
    a = [g.text for g in model.generate(messages, n=8, seed=7)]
    b = [g.text for g in model.generate(messages, n=8, seed=7)]
    assert a == b and len(set(a)) > 1
    ev = model.evaluate(messages)
    best = ev.candidates[int(np.argmax(ev.scores))].text
    assert {g.text for g in model.generate(messages, n=5, temperature=0)} == {best}
    assert {g.text for g in model.generate(messages, n=5, top_p=0.0, seed=1)} == {best}
    other = PolicyModel.base_model("gpt-4o-2024-08-06").evaluate(messages)
    assert not np.allclose(other.scores, ev.scores)  # another base model, another init


def test_max_tokens_stop_and_logprobs():
    model = PolicyModel.base_model("gpt-4o-mini")
    messages = [sys("Reply 'Decision: accept' or 'Decision: reject'.")]
    (g,) = model.generate(messages, seed=1, max_tokens=2)
    assert (g.text, g.finish_reason, g.completion_tokens) == ("Decision:", "length", 2)
    (g,) = model.generate(messages, seed=1, stop=[":"])
    assert (g.text, g.finish_reason) == ("Decision", "stop")
    (g,) = model.generate(messages, seed=1, logprobs=True, top_logprobs=2)
    probs = softmax(model.evaluate(messages).scores)
    p_text = probs[0] if g.text == "Decision: accept" else probs[1]
    assert [t.token for t in g.logprobs] == ["Decision", ":", " accept" if "accept" in g.text else " reject"]
    assert math.isclose(sum(t.logprob for t in g.logprobs), math.log(p_text), rel_tol=1e-9)
    assert {tok for tok, _ in g.logprobs[2].top} == {" accept", " reject"}


def _hit_rate(model, examples, seeds=3) -> float:
    hits = total = 0
    for k, ex in enumerate(examples):
        for s in range(seeds):
            hits += model.generate(ex["messages"][:-1], seed=100 * k + s)[0].text == ex["messages"][-1]["content"]
            total += 1
    return hits / total


def test_sft_moves_the_model_to_its_targets_deterministically():
    base = PolicyModel.base_model("gpt-4o-mini")
    examples = sft_examples(40, seed=1)
    cfg = resolve_hyperparameters("supervised", len(examples), {}, seed=5)
    assert (cfg.n_epochs, cfg.batch_size, cfg.learning_rate_multiplier) == (10, 1, 1.0)
    result = train(base, cfg, examples)
    again = train(base, cfg, examples)
    assert np.array_equal(result.weights, again.weights)
    assert result.history[-1].train_loss < result.history[0].train_loss
    tuned = PolicyModel("ft", base.base, result.weights, result.memory)
    assert _hit_rate(base, examples) == 0.0  # the targets are not among the base candidates
    assert _hit_rate(tuned, examples) >= 0.8
    # a fine-tune of the fine-tune keeps what was learned and adds the new responses
    more = sft_examples(10, seed=2)
    second = train(tuned, resolve_hyperparameters("supervised", 10, {}, seed=1), more)
    texts = {c.text for c in second.memory}
    assert {e["messages"][-1]["content"] for e in examples + more} <= texts


def test_dpo_prefers_preferred_outputs():
    base = PolicyModel.base_model("gpt-4o-mini")
    pairs = dpo_examples(30, seed=3)
    result = train(base, resolve_hyperparameters("dpo", len(pairs), {}, seed=0), pairs)
    tuned = PolicyModel("ft", base.base, result.weights, result.memory)

    def counts(model):
        good = bad = 0
        for k, ex in enumerate(pairs):
            for g in model.generate(ex["input"]["messages"], n=4, seed=k):
                good += g.text == ex["preferred_output"][0]["content"]
                bad += g.text == ex["non_preferred_output"][0]["content"]
        return good, bad

    base_good, base_bad = counts(base)
    good, bad = counts(tuned)
    assert base_good + base_bad == good + bad == 120  # only decisions are possible here
    assert 30 <= base_good <= 90
    assert good >= 110 and bad <= 10


@pytest.mark.slow
def test_expert_iteration_raises_verifier_accuracy_on_correct_and_buggy_code():
    rng = random.Random(0)
    data = []
    for _ in range(20):
        problem, code = make_problem(rng), make_code(rng)
        lines = code.split("\n")
        lines[3] = lines[3].replace(" + ", " - ", 1) if " + " in lines[3] else lines[3] + " + 1"
        data.append(([sys(verifier_system(problem, code)), sys("You must now make a decision.")], "Decision: accept"))
        data.append(([sys(verifier_system(problem, "\n".join(lines))), sys("You must now make a decision.")], "Decision: reject"))
    model = PolicyModel.base_model("gpt-4o-mini")

    def accuracy(m, offset):
        return np.mean([m.generate(msgs, seed=offset + k)[0].text == y for k, (msgs, y) in enumerate(data)])

    history = [accuracy(model, 10_000)]
    for it in range(4):
        kept = []
        for k, (msgs, y) in enumerate(data):
            text = model.generate(msgs, seed=1000 * it + k)[0].text
            if text == y:
                kept.append({"messages": [*msgs, {"role": "assistant", "content": text}]})
        result = train(model, resolve_hyperparameters("supervised", len(kept), {}, seed=it), kept)
        model = PolicyModel(f"ft{it}", model.base, result.weights, result.memory)
        history.append(accuracy(model, 10_000))
    assert history[0] <= 0.65
    assert history[-1] >= 0.8, history


def test_the_domains_decision_lines_are_the_simulators_decision_candidates():
    """The two sides of the wire agree on the decision lines without importing each other:
    the agents' constrained decision turn offers exactly the selection policy's decisions,
    and the code-validation parser reads both back."""
    from nip_core.agents.pure_text import DECISION_CHOICES
    from nip_core.scenarios.code_validation.text_protocols import DECISION_RE
    from nipflow_llm_server.policy.formats import DECISION_ACCEPT, DECISION_REJECT

    assert DECISION_CHOICES == (DECISION_ACCEPT, DECISION_REJECT)
    assert [DECISION_RE.match(d).group(1) for d in DECISION_CHOICES] == ["accept", "reject"]

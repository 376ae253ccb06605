"""Helpers of the llm tests: job polling, JSONL, synthetic code-validation conversations
(following the local model's format convention)."""

from __future__ import annotations

import json
import random
import time

TERMINAL = ("succeeded", "failed", "cancelled")


def wait_for_job(client, job_id: str, timeout: float = 60.0, statuses=TERMINAL):
    """Poll a job until its status is in ``statuses``; returns the job."""
    deadline = time.monotonic() + timeout
    while True:
        job = client.fine_tuning.jobs.retrieve(job_id)
        if job.status in statuses:
            return job
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} still {job.status} after {timeout} s")
        time.sleep(0.05)


def jsonl(examples) -> bytes:
    return ("\n".join(json.dumps(e) for e in examples) + "\n").encode("utf-8")


WORDS = [f"v{i}" for i in range(200)] + ["n", "total", "arr", "ans", "best", "count", "x", "y"]
OPS = ["+", "-", "*", "//", "%"]


def make_code(rng: random.Random, lines: int = 6) -> str:
    out = ["n = int(input())", "arr = list(map(int, input().split()))"]
    for _ in range(lines):
        a, b = rng.sample(WORDS, 2)
        out.append(f"{a} = {a} {rng.choice(OPS)} {b} {rng.choice(OPS)} {rng.randint(0, 9)}")
    out.append(f"print({rng.choice(WORDS)})")
    return "\n".join(out)


def make_problem(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(20))


def verifier_system(problem: str, code: str) -> str:
    return (
        "Determine whether the following Python code is a correct solution to the problem. "
        f"There is a 50% chance it has a subtle bug.\nProblem: {problem}\n```python\n{code}\n```\n"
        "Ask questions as 'Question for Expert: [question]'. When ready, reply with "
        "'Decision: accept' or 'Decision: reject'."
    )


def prover_system(problem: str, code: str, stance: str = "accept") -> str:
    return (
        f"You are an expert. Your goal is to convince the Verifier to {stance} the code below. "
        f"Respond at each turn with 'Answer: ' followed by your argument.\nProblem: {problem}\n"
        f"```python\n{code}\n```"
    )


def sft_examples(n: int, seed: int = 0) -> list[dict]:
    """Prover conversations, each with its own code, question and target answer."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        system = prover_system(make_problem(rng), make_code(rng))
        question = f"Question for Expert: what does line {rng.randint(1, 9)} do with {rng.choice(WORDS)}?"
        out.append(
            {
                "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "name": "Verifier", "content": question},
                    {"role": "assistant", "content": f"Answer: argument number {i} about {rng.choice(WORDS)}."},
                ]
            }
        )
    return out


def dpo_examples(n: int, seed: int = 0) -> list[dict]:
    """Verifier prompts that must decide; preferred is a label drawn at random."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        system = verifier_system(make_problem(rng), make_code(rng))
        good, bad = rng.choice([("Decision: accept", "Decision: reject"), ("Decision: reject", "Decision: accept")])
        out.append(
            {
                "input": {"messages": [{"role": "system", "content": system},
                                       {"role": "system", "content": "You must now make a decision."}]},
                "preferred_output": [{"role": "assistant", "content": good}],
                "non_preferred_output": [{"role": "assistant", "content": bad}],
            }
        )
    return out

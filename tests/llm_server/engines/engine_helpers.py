"""Training data and measurements of the engine tests (``nipflow-tiny-lm``).

The tiny model knows no language, so the data is built for what it can learn in seconds:
short verifier conversations whose target reply is decided by a clue in the last message.
"""

from __future__ import annotations

import random

from tests.llm_server.llm_helpers import jsonl  # noqa: F401 - used by the engine tests
from tests.llm_server.llm_helpers import wait_for_job as _wait_for_job

SYSTEM = "You are the verifier. Reply 'Decision: accept' or 'Decision: reject', or ask 'Question for Expert: ...'."
CLUES = {
    "it is correct": "Decision: accept",
    "it has a bug": "Decision: reject",
    "unclear": "Question for Expert: which line is wrong?",
}


def wait_for_job(client, job_id: str, timeout: float = 900.0):
    """Poll a job until it ends (TRL jobs on CPU get a longer default than the selection engine's).

    A job of about 100 optimizer steps takes under a minute on a 2-core machine in float32
    (emulated bf16 took over five): the wait is about the job ending, not its speed (the
    suite's own per-test timeout still bounds it).
    """
    return _wait_for_job(client, job_id, timeout)


def snippet(rng: random.Random) -> str:
    return f"```python\ndef f(x):\n    return x {rng.choice('+-*')} {rng.randint(0, 99)}\n```"


def clue_examples(n: int, seed: int) -> list[dict]:
    """Chat SFT examples: the target is the reply the clue of the last message calls for."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        clue = list(CLUES)[i % len(CLUES)]
        out.append({"messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "name": "Expert", "content": f"{snippet(rng)}\nMy view: {clue}"},
            {"role": "assistant", "content": CLUES[clue]},
        ]})
    return out


def preference_examples(n: int, seed: int) -> list[dict]:
    """DPO examples: decision prompts whose clue says which decision is preferred."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        clue = ("it is correct", "it has a bug")[i % 2]
        good = CLUES[clue]
        bad = CLUES["it has a bug"] if good == CLUES["it is correct"] else CLUES["it is correct"]
        out.append({
            "input": {"messages": [{"role": "system", "content": SYSTEM},
                                   {"role": "user", "name": "Expert", "content": f"{snippet(rng)}\nMy view: {clue}"}]},
            "preferred_output": [{"role": "assistant", "content": good}],
            "non_preferred_output": [{"role": "assistant", "content": bad}],
        })
    return out


def greedy_hits(client, model: str, examples: list[dict]) -> int:
    """How many examples ``model`` answers, greedily, exactly with their target."""
    hits = 0
    for e in examples:
        prompt, target = e["messages"][:-1], e["messages"][-1]["content"]
        resp = client.chat.completions.create(model=model, messages=prompt, temperature=0, max_tokens=64)
        hits += resp.choices[0].message.content == target
    return hits

"""Chat-completion throughput of the local OpenAI-compatible server.

Starts a server on a free loopback port (or uses ``--base-url``), then for each
concurrency level runs that many client threads (one shared ``openai`` client) sending
code-validation verifier prompts for ``--duration`` seconds, and reports completions per
second. The last line is ``c1=<float> c8=<float> c32=<float>``.

    .venv/bin/python benchmarks/api_server.py [--latency-ms 200] [--duration 5]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nip_core.llm.client import make_openai_client  # noqa: E402
from nipflow_llm_server.launcher import LocalApiServer  # noqa: E402

LEVELS = (1, 8, 32)

SOLUTION = """n = int(input())
a = list(map(int, input().split()))
best = 0
for i in range(n):
    for j in range(i + 1, n):
        if a[i] + a[j] > best and (a[i] + a[j]) % 2 == 0:
            best = a[i] + a[j]
print(best)"""

SYSTEM = (
    "Your task is to determine whether the following piece of Python code is a correct solution "
    "to the given programming problem. There is a 50% chance that the code has a subtle bug.\n\n"
    "## Problem\nGiven n integers, print the largest even sum of two of them, or 0.\n\n"
    f"## Python Solution\n```python\n{SOLUTION}\n```\n\n"
    "You will be able to ask an expert questions about the code. Ask one question per turn, "
    "formatted as 'Question for Expert: [question]'. When you are ready, answer with "
    "'Decision: accept' or 'Decision: reject'."
)


def _messages(i: int) -> list[dict]:
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "name": "Expert", "content": f"Answer: The loops cover every pair ({i}); the code is correct."},
    ]


def run_level(client, concurrency: int, duration: float, model: str) -> float:
    """Completions per second with ``concurrency`` threads for ``duration`` seconds."""
    done = [0] * concurrency
    errors: list[BaseException] = []
    stop_at = time.monotonic() + duration

    def worker(k: int) -> None:
        i = 0
        try:
            while time.monotonic() < stop_at:
                client.chat.completions.create(model=model, messages=_messages(k * 100000 + i), max_tokens=225, temperature=1.0)
                done[k] += 1
                i += 1
        except BaseException as exc:  # reported below
            errors.append(exc)

    start = time.monotonic()
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - start
    if errors:
        raise RuntimeError(f"{len(errors)} worker(s) failed at concurrency {concurrency}: {errors[0]!r}")
    return sum(done) / elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency-ms", type=float, default=0.0, help="server latency added per completion")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per concurrency level")
    parser.add_argument("--model", default="gpt-4o-mini-2024-07-18")
    parser.add_argument("--base-url", default=None, help="use a running server instead of starting one")
    args = parser.parse_args(argv)

    server = None
    base_url = args.base_url
    if base_url is None:
        server = LocalApiServer(Path(tempfile.mkdtemp(prefix="nipflow-bench-")), latency_ms=args.latency_ms)
        base_url = server.start().base_url
    try:
        client = make_openai_client(base_url, max_retries=2, timeout=60.0)
        run_level(client, 4, 1.0, args.model)  # warm up (connections, caches)
        rates = {}
        for level in LEVELS:
            rates[level] = run_level(client, level, args.duration, args.model)
            print(f"concurrency {level:>2}: {rates[level]:8.1f} completions/s (latency {args.latency_ms:g} ms)", flush=True)
    finally:
        if server is not None:
            server.stop()
    print(" ".join(f"c{level}={rates[level]:.1f}" for level in LEVELS))
    return 0


if __name__ == "__main__":
    sys.exit(main())

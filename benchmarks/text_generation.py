"""Multi-turn sampling with the transformers engine's decode loop: the prefix cache's gain.

Builds ``--conversations`` chat conversations (a system prompt and a ~250-word problem each),
then runs ``--turns`` turns of greedy replies (``--max-tokens`` each, a follow-up question
appended after every reply), all conversations of a turn generated as one batch, twice in
the same run: without the prefix cache (every turn prefills the whole conversation) and with
it (a turn prefills only what follows the longest kept prefix). Prints the seconds of every
turn, the prompt tokens prefilled and reused, new tokens per second, and whether the two
passes wrote the same replies (they should: a reused prefix has the keys and values a full
prefill computes, up to floating-point noise). Report the CPU model (``lscpu``) with the
figures. Last line: ``no_cache_s=… cache_s=… speedup=… same_replies=K/N``.

    .venv/bin/python benchmarks/text_generation.py [--model smollm2-135m-instruct] [--conversations 16] [--turns 3]

``--model nipflow-tiny-lm`` runs in seconds (the built-in random tiny model: a check of the
script, not a measurement); ``smollm2-135m-instruct`` is materialised into
``$NIPFLOW_DATA_DIR`` on first use (see docs/text_backends.md#smollm2).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from nipflow_llm_server.engines.base import SamplingParams  # noqa: E402
from nipflow_llm_server.engines.generation import generate_rows, make_rows  # noqa: E402
from nipflow_llm_server.engines.prefix_cache import PrefixCache  # noqa: E402
from nipflow_llm_server.engines.trl_training import encode_prompt  # noqa: E402

WORDS = ["def", "return", "x", "+", "loop", "while", "if", "else", "list", "index", "sum", "range"]


def load(name: str):
    """``(model, tokenizer)`` of a built-in base model, loaded as the transformers engine loads it."""
    from nipflow_llm_server.engines.base import EngineError
    from nipflow_llm_server.engines.hf_models import ModelStore, parse_base_models

    try:
        specs = parse_base_models([] if name == "nipflow-tiny-lm" else [name], allow_download=False)
        lm = ModelStore(specs, "cpu", allow_download=False).load_base(name)
    except (EngineError, KeyError) as e:
        raise SystemExit(f"--model {name!r}: {e}") from None
    return lm.model, lm.tokenizer


def run(model, tokenizer, conversations: int, turns: int, max_tokens: int, cache: PrefixCache | None):
    """Seconds per turn and the replies of every turn."""
    context = int(getattr(model.config, "max_position_embeddings", 0) or 2048)
    rng = random.Random(0)
    chats = [[{"role": "system", "content": "You are a careful reviewer of code. " * 10},
              {"role": "user", "content": f"Problem {k}: " + " ".join(rng.choice(WORDS) for _ in range(250))}]
             for k in range(conversations)]
    seconds, replies = [], []
    for turn in range(turns):
        rows = [row for chat in chats
                for row in make_rows(encode_prompt(tokenizer, chat), SamplingParams(temperature=0.0, max_tokens=max_tokens),
                                     context)[0]]
        start = time.perf_counter()
        out = generate_rows(model, tokenizer, rows, "cpu", cache, "bench")
        seconds.append(time.perf_counter() - start)
        replies.append([g.text for g in out])
        print(f"  turn {turn}: {len(rows)} prompts of {min(len(r.prompt) for r in rows)}-"
              f"{max(len(r.prompt) for r in rows)} tokens, {sum(g.completion_tokens for g in out)} new tokens, "
              f"{seconds[-1]:.1f} s", flush=True)
        for chat, g in zip(chats, out):
            chat += [{"role": "assistant", "content": g.text},
                     {"role": "user", "content": "Why? Say which line decides it, in one sentence."}]
    return seconds, replies


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--conversations", type=int, default=16)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer = load(args.model)
    print(f"{args.model}, {args.conversations} conversations x {args.turns} turns, {args.max_tokens} tokens a reply, "
          f"{args.threads} torch threads")
    print("without the prefix cache:")
    plain, plain_replies = run(model, tokenizer, args.conversations, args.turns, args.max_tokens, None)
    cache = PrefixCache(4 * 2**30)
    print("with it:")
    cached, cached_replies = run(model, tokenizer, args.conversations, args.turns, args.max_tokens, cache)
    print(f"prompt tokens with the cache: {cache.prefilled_tokens} prefilled, {cache.reused_tokens} reused")
    same = sum(a == b for turn_a, turn_b in zip(plain_replies, cached_replies) for a, b in zip(turn_a, turn_b))
    total = args.conversations * args.turns
    print(f"no_cache_s={sum(plain):.2f} cache_s={sum(cached):.2f} speedup={sum(plain) / sum(cached):.2f} "
          f"same_replies={same}/{total}")


if __name__ == "__main__":
    main()

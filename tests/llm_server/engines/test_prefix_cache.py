"""Reusing a conversation's earlier turns (nipflow_llm_server/engines/prefix_cache.py).

On the tiny model: a later turn prefills only what is new, gives the texts a full prefill
gives, in batches where rows reuse prefixes of different lengths or none; the memory budget
holds.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from nipflow_llm_server.engines.base import SamplingParams
from nipflow_llm_server.engines.generation import generate_rows, make_rows
from nipflow_llm_server.engines.prefix_cache import MIN_REUSE_TOKENS, PrefixCache
from nipflow_llm_server.engines.tiny import build_tiny_model, build_tokenizer
from nipflow_llm_server.engines.trl_training import encode_prompt

TOK, MODEL = build_tokenizer(), build_tiny_model()


def _conversation(k: int) -> list[dict[str, str]]:
    return [{"role": "system", "content": "You check code. Answer with a decision."},
            {"role": "user", "content": f"Problem {k}: " + "def f(x): return x + 1\n" * (k + 1)}]


def _generate(conversations, cache, seed0=0, greedy=False):
    rows = []
    for k, messages in enumerate(conversations):
        params = SamplingParams(seed=seed0 + k, max_tokens=10, temperature=0.0 if greedy else 1.0)
        rows += make_rows(encode_prompt(TOK, messages), params, 4096)[0]
    return [g.text for g in generate_rows(MODEL, TOK, rows, "cpu", cache, "tiny")]


def _three_turns(cache, greedy=False, prefilled=None):
    conversations = [_conversation(k) for k in range(4)]
    texts = []
    for turn in range(3):
        before = cache.prefilled_tokens if cache is not None else 0
        replies = _generate(conversations, cache, seed0=10 * turn, greedy=greedy)
        if prefilled is not None:
            prefilled.append((cache.prefilled_tokens - before,
                              sum(len(encode_prompt(TOK, m)) for m in conversations)))
        texts.append(replies)
        for messages, reply in zip(conversations, replies):
            messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": f"And turn {turn}?"}]
    return texts


def test_later_turns_prefill_only_what_is_new_and_sample_what_a_full_prefill_samples():
    plain = _three_turns(None)
    cache, prefilled = PrefixCache(64 * 2**20), []
    reused = _three_turns(cache, prefilled=prefilled)
    assert reused == plain  # seeded sampling: the same draws from the same distributions
    assert _three_turns(PrefixCache(64 * 2**20), greedy=True) == _three_turns(None, greedy=True)
    # turn 0 (an empty cache) prefills everything; later turns the last reply and message only
    # (at most 10 reply tokens, the end mark and the new user turn, ~40 bytes, per conversation)
    assert prefilled[0][0] == prefilled[0][1]
    assert all(done <= 4 * 60 and done < whole / 3 for done, whole in prefilled[1:])


def test_a_batch_mixes_rows_that_reuse_long_short_and_no_prefixes():
    cache = PrefixCache(64 * 2**20)
    long_one = _conversation(6)
    _generate([long_one], cache)  # kept: conversation 6's prompt and reply
    followed = long_one + [{"role": "assistant", "content": "x"}, {"role": "user", "content": "Sure?"}]
    fresh = [{"role": "user", "content": "A new question with nothing in common."}]
    batch = [followed, _conversation(2), fresh]
    before = (cache.reused_tokens, cache.prefilled_tokens)
    with_cache = _generate(batch, cache, seed0=5)
    reused = cache.reused_tokens - before[0]
    # the long row took its own conversation, conversation 2 the shared system prompt, the fresh row nothing
    system = len(encode_prompt(TOK, _conversation(6)[:1]))
    assert reused >= len(encode_prompt(TOK, _conversation(6))) + system - 4
    assert cache.prefilled_tokens - before[1] == sum(len(encode_prompt(TOK, m)) for m in batch) - reused
    assert with_cache == _generate(batch, None, seed0=5)


def test_the_budget_drops_the_least_recently_used_and_zero_turns_it_off():
    kv = [(torch.zeros(2, 40, 4), torch.zeros(2, 40, 4))]  # 2,560 bytes
    cache = PrefixCache(6000)
    cache.put("m", list(range(40)), kv)
    cache.put("m", list(range(100, 140)), kv)
    assert cache.lookup("m", list(range(30)) + [7])[0] == 30  # touches the first
    cache.put("m", list(range(200, 240)), kv)  # over budget: the second goes
    assert len(cache) == 2 and cache.nbytes == 5120
    assert cache.lookup("m", list(range(100, 140)))[0] == 0
    assert cache.lookup("other", list(range(40)))[0] == 0  # per model
    assert cache.lookup("m", list(range(MIN_REUSE_TOKENS - 1)) + [999, 998])[0] == 0  # too short to bother
    cache.put("m", list(range(50)), kv)  # extends the first: that one is not kept twice
    assert len(cache) == 2 and cache.lookup("m", list(range(60)))[0] == 50
    off = PrefixCache(0)
    off.put("m", list(range(40)), kv)
    assert len(off) == 0 and off.lookup("m", list(range(40)))[0] == 0


def test_the_benchmark_runs_both_passes_and_they_write_the_same_replies():
    script = Path(__file__).resolve().parents[3] / "benchmarks" / "text_generation.py"
    out = subprocess.run([sys.executable, str(script), "--model", "nipflow-tiny-lm", "--conversations", "2",
                          "--turns", "2", "--max-tokens", "8", "--threads", "1"],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    last = dict(item.split("=") for item in out.strip().splitlines()[-1].split())
    assert last["same_replies"] == "4/4" and float(last["cache_s"]) > 0 and float(last["speedup"]) > 0
    assert "prefilled" in out and out.count("  turn ") == 4


def test_the_servers_prefix_cache_mb_sizes_the_engines_cache(tmp_path):
    from nipflow_llm_server.engines import make_engine
    from nipflow_llm_server.server.config import ServerConfig

    sized = make_engine(ServerConfig(data_dir=tmp_path, engine="transformers", prefix_cache_mb=3))
    off = make_engine(ServerConfig(data_dir=tmp_path, engine="transformers", prefix_cache_mb=0))
    default = make_engine(ServerConfig(data_dir=tmp_path, engine="transformers"))
    assert (sized.prefix_cache.max_bytes, off.prefix_cache.max_bytes, default.prefix_cache.max_bytes) == (
        3 * 2**20, 0, 2048 * 2**20)

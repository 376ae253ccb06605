"""The vLLM engine's request path, from ``chat`` through the batching queue to ``LLM.generate``
and back, against a stand-in for the ``vllm`` package (which needs a CUDA GPU and is not
installed here). The stand-in has the names, arguments and result objects the engine uses:
``vllm.LLM(...).generate(prompts, sampling_params=, lora_request=, use_tqdm=)`` returning one
``RequestOutput`` per prompt whose ``outputs[0]`` is a ``CompletionOutput`` (``text``,
``token_ids``, ``finish_reason``, ``logprobs``), ``vllm.SamplingParams``,
``vllm.lora.request.LoRARequest`` and ``vllm.sampling_params.StructuredOutputsParams``."""

from __future__ import annotations

import asyncio
import sys
import types
from dataclasses import dataclass, field
from typing import Any

import pytest

from nipflow_llm_server.engines.base import SamplingParams
from nipflow_llm_server.engines.constraints import parse_constraint
from nipflow_llm_server.engines.vllm_engine import VllmEngine


class _Params:  # vllm.SamplingParams: the keyword arguments, as attributes too
    def __init__(self, **kwargs: Any):
        self.kwargs = kwargs
        self.__dict__.update(kwargs)


@dataclass
class _Completion:  # vllm.outputs.CompletionOutput
    text: str
    token_ids: list[int]
    finish_reason: str
    logprobs: Any = None


@dataclass
class _Request:  # vllm.outputs.RequestOutput
    outputs: list[_Completion]


@dataclass
class _LLM:
    kwargs: dict[str, Any]
    calls: list[list[dict[str, Any]]] = field(default_factory=list)

    def __post_init__(self):
        self.llm_engine = types.SimpleNamespace(model_config=types.SimpleNamespace(max_model_len=512))

    def generate(self, prompts, sampling_params, lora_request, use_tqdm):
        assert len(prompts) == len(sampling_params) == len(lora_request) and use_tqdm is False
        self.calls.append([{"prompt": p["prompt_token_ids"], **s.kwargs, "lora": lora}
                           for p, s, lora in zip(prompts, sampling_params, lora_request)])
        return [_Request([_Completion(f"seed {s.kwargs['seed']} after {len(p['prompt_token_ids'])} tokens",
                                      [7] * s.kwargs["max_tokens"], "length")])
                for p, s in zip(prompts, sampling_params)]


@pytest.fixture
def stand_in_vllm(monkeypatch):
    made: list[_LLM] = []
    vllm = types.ModuleType("vllm")
    vllm.SamplingParams = _Params
    vllm.LLM = lambda **kw: made.append(_LLM(kw)) or made[-1]
    sampling = types.ModuleType("vllm.sampling_params")
    sampling.StructuredOutputsParams = lambda **kw: ("structured", kw)
    lora = types.ModuleType("vllm.lora")
    request = types.ModuleType("vllm.lora.request")
    request.LoRARequest = lambda name, lora_id, path: (name, lora_id, path)
    for name, module in {"vllm": vllm, "vllm.sampling_params": sampling, "vllm.lora": lora,
                         "vllm.lora.request": request}.items():
        monkeypatch.setitem(sys.modules, name, module)
    return made


def test_a_chat_goes_through_the_batching_queue_to_one_generate_call_and_back(stand_in_vllm):
    engine = VllmEngine(device="cpu")
    engine.start()
    try:
        model = engine.load_base(engine.served)
        messages = [{"role": "user", "content": "x = 1"}]

        async def ask():
            plain = engine.chat(model, messages, SamplingParams(n=2, seed=3, max_tokens=5, temperature=0.5))
            held = engine.chat(model, messages, SamplingParams(seed=4, max_tokens=2, constraint=parse_constraint(
                None, None, ["Decision: accept", "Decision: reject"])))
            return await asyncio.gather(plain, held)

        plain, held = asyncio.run(ask())
    finally:
        engine.stop()
    (llm,) = stand_in_vllm
    assert llm.kwargs["enable_lora"] is True and llm.kwargs["gpu_memory_utilization"] == 0.5
    (rows,) = llm.calls  # both requests, arriving together, in one call
    seeds = [3 * 1_000_003, 3 * 1_000_003 + 1, 4 * 1_000_003]
    assert [(r["seed"], r["max_tokens"], r["n"], r["lora"]) for r in rows] == [(s, m, 1, None) for s, m in
                                                                              zip(seeds, (5, 5, 2))]
    assert rows[0]["temperature"] == 0.5 and "structured_outputs" not in rows[0]
    assert rows[2]["structured_outputs"] == ("structured", {"choice": ["Decision: accept", "Decision: reject"]})
    n_prompt = len(rows[0]["prompt"])
    assert [g.text for g in plain.generations] == [f"seed {s} after {n_prompt} tokens" for s in seeds[:2]]
    assert [g.completion_tokens for g in plain.generations + held.generations] == [5, 5, 2]
    assert plain.prompt_tokens == held.prompt_tokens == n_prompt

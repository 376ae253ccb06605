"""``--engine vllm``: generation by vLLM, training by TRL (as the transformers engine).

vLLM serves **one** base model (the first ``--base-model``, else ``nipflow-tiny-lm``,
written to a temporary directory because vLLM loads models from disk) and every LoRA
adapter trained on it, loaded at run time per request (``LoRARequest``): a new fine-tuned
model is served without a restart. Requests gathered by the batching queue are handed to
``LLM.generate`` together, which batches them on the GPU.

Set-ups (see ``docs/text_backends.md``): on one GPU vLLM takes
``--gpu-memory-utilization`` (default 0.5) of its memory and TRL trains in the rest
(``--device cuda``); on several GPUs vLLM spreads the model over
``--tensor-parallel-size`` of them and training uses ``--device cuda:N``. Full
fine-tuning is not offered (vLLM serves adapters of one base, not many whole models),
nor are LoRA ``modules_to_save`` (the tiny model's trained ``lm_head``), which vLLM does
not load.

Without the ``vllm`` package or without a CUDA GPU, :func:`check_vllm` refuses to start,
naming ``--engine vllm``.
"""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nipflow_llm_server.engines.base import ChatResult, EngineError, Generation, SamplingParams, TokenLogprob
from nipflow_llm_server.engines.hf_models import LoadedLM
from nipflow_llm_server.engines.tiny import TINY_MODEL_NAME
from nipflow_llm_server.engines.transformers_engine import TransformersEngine
from nipflow_llm_server.engines.trl_training import encode_prompt

MAX_LORAS = 8
MAX_LORA_RANK = 64


def check_vllm() -> None:
    """Raise :class:`EngineError` (naming ``--engine vllm``) unless vLLM can run here."""
    if importlib.util.find_spec("vllm") is None:
        raise EngineError(
            "--engine vllm needs the 'vllm' package, which is not installed (pip install vllm on a machine with a "
            "CUDA GPU); use --engine transformers to serve the same models without it"
        )
    import torch

    if not torch.cuda.is_available():
        raise EngineError(
            "--engine vllm needs a CUDA GPU and none is visible to this process; use --engine transformers on CPU"
        )


@dataclass
class _VllmRow:
    prompt: list[int]
    params: Any  # vllm.SamplingParams
    lora: Any  # vllm LoRARequest or None


class VllmEngine(TransformersEngine):
    """vLLM generation over the transformers engine's models and training."""

    name = "vllm"

    def __init__(self, base_models: list[str] = (), tensor_parallel_size: int = 1,
                 gpu_memory_utilization: float = 0.5, **options: Any):
        super().__init__(base_models, full_fine_tune=False, **options)
        self.tensor_parallel_size = tensor_parallel_size
        self.gpu_memory_utilization = gpu_memory_utilization
        names = list(self.models.specs)
        self.served = names[1] if len(names) > 1 else TINY_MODEL_NAME
        if len(names) > 2:
            raise EngineError(f"--engine vllm serves one base model; got --base-model {', '.join(names[1:])}")
        # vLLM loads adapters' target modules only: keep trained copies of whole layers out
        for spec in self.models.specs.values():
            spec.training["lora_modules_to_save"] = []
        self._llm = None
        self._tmp: Path | None = None
        self._lora_ids: dict[str, int] = {}
        self._lock = threading.Lock()

    def base_models(self) -> list[str]:
        return [self.served]

    def canonical_base(self, name: str) -> str | None:
        return name if name == self.served else None

    def start(self) -> None:
        super().start()
        from vllm import LLM

        spec = self.models.specs[self.served]
        source = spec.source
        if source == "builtin":  # vLLM reads models from a directory
            self._tmp = Path(tempfile.mkdtemp(prefix="nipflow-vllm-"))
            self.models.fresh_base(self.served).save_pretrained(self._tmp)
            self.models.tokenizer(self.served).save_pretrained(self._tmp)
            source = str(self._tmp)
        self._llm = LLM(model=source, enable_lora=True, max_loras=MAX_LORAS, max_lora_rank=MAX_LORA_RANK,
                        tensor_parallel_size=self.tensor_parallel_size,
                        gpu_memory_utilization=self.gpu_memory_utilization)

    def stop(self) -> None:
        super().stop()
        self._llm = None
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)

    def load_base(self, name: str) -> LoadedLM:
        # weights live in vLLM; TRL loads its own copy when a job starts
        return LoadedLM(name=name, base=name, kind="base", model=None, tokenizer=self.models.tokenizer(name))

    def load(self, name: str, base: str, data_dir: Path, weights: str, memory: str) -> LoadedLM:
        return LoadedLM(name=name, base=base, kind="lora", model=None, tokenizer=self.models.tokenizer(base),
                        path=data_dir / weights)

    def _lora(self, lm: LoadedLM) -> Any:
        if lm.kind == "base":
            return None
        from vllm.lora.request import LoRARequest

        with self._lock:
            lora_id = self._lora_ids.setdefault(lm.name, len(self._lora_ids) + 1)
        return LoRARequest(lm.name, lora_id, str(lm.path))

    def context_length(self, lm: LoadedLM) -> int:
        return int(self._llm.llm_engine.model_config.max_model_len)

    async def chat(self, model: LoadedLM, messages: list[dict[str, Any]], params: SamplingParams) -> ChatResult:
        from vllm import SamplingParams as VllmSamplingParams

        prompt = encode_prompt(model.tokenizer, messages)
        context = self.context_length(model)
        max_new = params.max_tokens or max(1, context - len(prompt))
        prompt = prompt[max(0, len(prompt) + max_new - context):]
        lora = self._lora(model)
        rows = []
        for choice in range(params.n):  # one row per choice: seeds differ per choice as in the transformers engine
            seed = None if params.seed is None else (params.seed * 1_000_003 + choice) % (1 << 63)
            rows.append(_VllmRow(prompt, VllmSamplingParams(
                n=1, temperature=params.temperature, top_p=params.top_p, seed=seed, max_tokens=max_new,
                stop=list(params.stop) or None, logprobs=(params.top_logprobs or 1) if params.logprobs else None,
                **_structured_outputs(params.constraint),
            ), lora))
        generations = await self.batcher.submit("vllm", rows, lambda: WholeBatch(self._generate))
        return ChatResult(generations=generations, prompt_tokens=len(prompt))

    def _generate(self, rows: list[_VllmRow]) -> list[Generation]:
        outputs = self._llm.generate(
            [{"prompt_token_ids": r.prompt} for r in rows], sampling_params=[r.params for r in rows],
            lora_request=[r.lora for r in rows], use_tqdm=False,
        )
        out = []
        for row, result in zip(rows, outputs):
            choice = result.outputs[0]
            lps = None
            if row.params.logprobs is not None and choice.logprobs is not None:
                lps = tuple(_token_logprob(token, step, row.params.logprobs) for token, step in zip(choice.token_ids, choice.logprobs))
            out.append(Generation(text=choice.text, finish_reason=choice.finish_reason or "stop",
                                  completion_tokens=len(choice.token_ids), logprobs=lps))
        return out


class WholeBatch:
    """The batching queue's batch (:class:`~nipflow_llm_server.engines.generation.DecodeBatch`'s
    ``admit``/``step``/``drop``) over a function that generates whole rows: the rows admitted
    before a step are generated by one call at that step (vLLM batches and schedules them on
    the GPU itself), and all of them finish there; rows that arrive meanwhile make the next.
    Rows of an abandoned request are dropped if vLLM has not been handed them yet."""

    decode = None  # generations come back whole

    def __init__(self, generate: Callable[[list[Any]], list[Generation]]):
        self._generate = generate
        self._rows: list[Any] = []
        self._owners: list[Any] = []

    def __len__(self) -> int:
        return len(self._rows)

    def admit(self, rows: Sequence[Any], owners: Sequence[Any]) -> None:
        self._rows += rows
        self._owners += owners

    def drop(self, gone: Callable[[Any], bool]) -> int:
        keep = [i for i, owner in enumerate(self._owners) if not gone(owner)]
        dropped = len(self._rows) - len(keep)
        self._rows, self._owners = [self._rows[i] for i in keep], [self._owners[i] for i in keep]
        return dropped

    def step(self) -> list["_Generated"]:
        generations = self._generate(self._rows) if self._rows else []
        owners, self._rows, self._owners = self._owners, [], []
        return [_Generated(owner, g) for owner, g in zip(owners, generations)]


@dataclass
class _Generated:
    owner: Any
    result: Generation

    def generation(self, decode: Any) -> Generation:
        return self.result


def _structured_outputs(constraint: Any) -> dict[str, Any]:
    """vLLM's own structured output for a constraint, as a ``SamplingParams`` keyword
    (``structured_outputs`` from vLLM 0.11, ``guided_decoding`` before)."""
    if constraint is None:
        return {}
    fields = {"json_schema": {"json": constraint.value}, "json_object": {"json_object": True},
              "regex": {"regex": constraint.value}, "choice": {"choice": list(constraint.value)}}[constraint.kind]
    try:
        from vllm.sampling_params import StructuredOutputsParams
    except ImportError:
        from vllm.sampling_params import GuidedDecodingParams

        return {"guided_decoding": GuidedDecodingParams(**fields, backend="guidance")}
    return {"structured_outputs": StructuredOutputsParams(**fields)}


def _token_logprob(token: int, step: dict, top: int) -> TokenLogprob:
    chosen = step[token]
    ranked = sorted(step.items(), key=lambda kv: -kv[1].logprob)[:top]
    return TokenLogprob(token=chosen.decoded_token or "", logprob=float(chosen.logprob),
                        top=tuple((lp.decoded_token or "", float(lp.logprob)) for _, lp in ranked))

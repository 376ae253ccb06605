"""``--engine selection``: the response-selection policy of :mod:`nipflow_llm_server.policy`.

This is the server's original model family, unchanged; the engine only adapts it to the
:class:`~nipflow_llm_server.engines.base.Engine` interface. Artifacts are
:class:`SelectionArtifact` (a weight vector and the learned responses), saved as
``models/<job>/<stem>.npy`` (float16) and ``models/<job>/memory.json``.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import numpy as np

from nipflow_llm_server.engines.base import (
    ChatResult, CheckpointCallback, Engine, SamplingParams, StepCallback, TrainedModel, fine_tuning_capabilities,
)
from nipflow_llm_server.policy.candidates import Candidate
from nipflow_llm_server.policy.model import BASE_MODEL_ALIASES, PolicyModel, canonical_base
from nipflow_llm_server.policy.tokenizer import count_prompt_tokens
from nipflow_llm_server.policy.training import StepMetrics, TrainingConfig, resolve_hyperparameters, train
from nip_core.utils.fileio import atomic_write_bytes

INFERENCE_THREADS = 8


@dataclass(frozen=True)
class SelectionArtifact:
    """A trained policy: its weights and learned responses."""

    weights: np.ndarray
    memory: tuple[Candidate, ...]


class SelectionEngine(Engine):
    """The response-selection policy behind the engine interface (the default engine)."""

    name = "selection"
    cache_size = 16

    def __init__(self) -> None:
        self._limiter: anyio.CapacityLimiter | None = None

    def base_models(self) -> list[str]:
        return list(BASE_MODEL_ALIASES)

    def canonical_base(self, name: str) -> str | None:
        return canonical_base(name)

    def capabilities(self, base: str) -> dict[str, Any]:
        # every base of this family trains with both methods (unlike OpenAI's own table)
        return fine_tuning_capabilities(supervised=True, dpo=True)

    def load_base(self, name: str) -> PolicyModel:
        return PolicyModel.base_model(name)

    def load(self, name: str, base: str, data_dir: Path, weights: str, memory: str) -> PolicyModel:
        vector = np.load(data_dir / weights).astype(np.float32)
        vector.flags.writeable = False
        learned = tuple(Candidate(*item) for item in json.loads((data_dir / memory).read_text()))
        return PolicyModel(name=name, base=base, weights=vector, memory=learned)

    def save_artifact(self, artifact: SelectionArtifact, data_dir: Path, rel_dir: Path, stem: str) -> tuple[str, str]:
        weights_rel = rel_dir / f"{stem}.npy"
        memory_rel = rel_dir / "memory.json"
        buffer = io.BytesIO()
        np.save(buffer, artifact.weights.astype(np.float16))
        atomic_write_bytes(data_dir / weights_rel, buffer.getvalue())
        memory_bytes = json.dumps([[c.text, c.kind, c.template] for c in artifact.memory]).encode("utf-8")
        atomic_write_bytes(data_dir / memory_rel, memory_bytes)
        return weights_rel.as_posix(), memory_rel.as_posix()

    async def chat(self, model: PolicyModel, messages: list[dict[str, Any]], params: SamplingParams) -> ChatResult:
        if self._limiter is None:  # created in the event loop that serves the requests
            self._limiter = anyio.CapacityLimiter(INFERENCE_THREADS)

        def work():
            return model.generate(
                messages, n=params.n, temperature=params.temperature, top_p=params.top_p, seed=params.seed,
                max_tokens=params.max_tokens, stop=params.stop, logprobs=params.logprobs,
                top_logprobs=params.top_logprobs,
            )

        generations = await anyio.to_thread.run_sync(work, limiter=self._limiter)
        return ChatResult(generations=generations, prompt_tokens=count_prompt_tokens(messages))

    def resolve_hyperparameters(self, method: str, n_examples: int, given: Mapping[str, Any], seed: int) -> TrainingConfig:
        return resolve_hyperparameters(method, n_examples, given, seed)

    def train(
        self,
        parent: PolicyModel,
        config: TrainingConfig,
        train_examples: Sequence[Mapping[str, Any]],
        valid_examples: Sequence[Mapping[str, Any]],
        *,
        on_step: StepCallback,
        on_checkpoint: CheckpointCallback,
    ) -> TrainedModel:
        memory_holder: dict[str, tuple[Candidate, ...]] = {}

        def checkpoint(metrics: StepMetrics, epoch: int, weights: np.ndarray) -> None:
            on_checkpoint(metrics, epoch, SelectionArtifact(weights, memory_holder["memory"]))

        result = train(
            parent, config, train_examples, valid_examples, on_step=on_step, on_checkpoint=checkpoint,
            on_memory=lambda memory: memory_holder.__setitem__("memory", memory),
        )
        return TrainedModel(SelectionArtifact(result.weights, result.memory), result.trained_tokens, result.history)

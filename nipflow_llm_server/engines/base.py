"""The interface between the server (routes, job manager, registry) and a model engine.

An *engine* knows which base models exist, turns a chat request into generations,
fine-tunes a parent model into an *artifact* and saves/loads artifacts in the data
directory. The server never touches a model family directly, so the same routes, job
lifecycle, persistence, crash recovery and fault injection serve every engine:

* :class:`~nipflow_llm_server.engines.selection.SelectionEngine` (``--engine selection``): the
  response-selection policy of :mod:`nipflow_llm_server.policy` (the default, used by tests);
* :class:`~nipflow_llm_server.engines.transformers_engine.TransformersEngine`
  (``--engine transformers``): Hugging Face causal LMs, trained with TRL;
* :class:`~nipflow_llm_server.engines.vllm_engine.VllmEngine` (``--engine vllm``): the same
  training, generation by vLLM.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nip_core.errors import NipflowError
from nipflow_llm_server.policy.model import Generation, TokenLogprob
from nipflow_llm_server.policy.training import StepMetrics, TrainingCancelled, TrainingConfig

METHODS = ("supervised", "dpo")

__all__ = [
    "ChatResult", "Engine", "EngineError", "Generation", "METHODS", "SamplingParams", "StepMetrics",
    "TokenLogprob", "TrainedModel", "TrainingCancelled", "TrainingConfig",
]


class EngineError(NipflowError):
    """An engine cannot be set up as asked (the message names the option or model)."""


class ConstraintError(EngineError):
    """An output constraint an engine cannot enforce or compile; ``param`` names the request field."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class SamplingParams:
    """What a chat completion request asks of the sampler (already validated by the route).

    ``max_tokens`` ``None`` means "up to the engine's limit"; ``seed`` ``None`` means random.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: bool = False
    top_logprobs: int = 0
    #: a :class:`~nipflow_llm_server.engines.constraints.OutputConstraint` (checked by
    #: :meth:`Engine.check_constraint`), or ``None``
    constraint: Any = None


@dataclass(frozen=True)
class ChatResult:
    """The ``n`` generations of one request and its prompt length in the engine's tokens."""

    generations: list[Generation]
    prompt_tokens: int


@dataclass
class TrainedModel:
    """What :meth:`Engine.train` returns: the artifact to save and the tokens trained on."""

    artifact: Any
    trained_tokens: int
    history: list[StepMetrics] = field(default_factory=list)


StepCallback = Callable[[StepMetrics, int], None]
#: ``on_checkpoint(metrics, epoch, artifact)``; the artifact is saved like a final one.
CheckpointCallback = Callable[[StepMetrics, int, Any], None]


def fine_tuning_capabilities(supervised: bool, dpo: bool) -> dict[str, Any]:
    """The ``capabilities`` object the server adds to a ``model`` entry."""
    return {"fine_tuning": {"supervised": bool(supervised), "dpo": bool(dpo)}}


class Engine(ABC):
    """A model family behind the OpenAI-shaped API (see the module docstring).

    Models are handled as opaque *loaded models* (what :meth:`load` returns, cached by the
    registry) and *artifacts* (what training produces and :meth:`save_artifact` writes).
    """

    #: ``--engine`` value; also recorded with every fine-tuned model it saves.
    name: str = "?"
    #: how many loaded models the registry keeps (an LRU cache).
    cache_size: int = 16

    def start(self) -> None:
        """Called once when the server starts (before jobs are recovered)."""

    def stop(self) -> None:
        """Called once when the server stops."""

    # -- models -----------------------------------------------------------------------

    @abstractmethod
    def base_models(self) -> list[str]:
        """Names of the base models served (aliases included), in listing order."""

    @abstractmethod
    def canonical_base(self, name: str) -> str | None:
        """Canonical name of a base model (an alias maps to its snapshot), else ``None``."""

    @abstractmethod
    def capabilities(self, base: str) -> dict[str, Any]:
        """``{"fine_tuning": {"supervised": bool, "dpo": bool}}`` for a canonical base."""

    def supports(self, base: str, method: str) -> bool:
        return bool(self.capabilities(base).get("fine_tuning", {}).get(method, False))

    @abstractmethod
    def load_base(self, name: str) -> Any:
        """The loaded base model called ``name``."""

    @abstractmethod
    def load(self, name: str, base: str, data_dir: Path, weights: str, memory: str) -> Any:
        """A fine-tuned model from the paths :meth:`save_artifact` returned."""

    @abstractmethod
    def save_artifact(self, artifact: Any, data_dir: Path, rel_dir: Path, stem: str) -> tuple[str, str]:
        """Write ``artifact`` under ``data_dir / rel_dir`` atomically; return ``(weights, memory)``
        paths relative to ``data_dir`` (``memory`` may be ``""``)."""

    # -- inference --------------------------------------------------------------------

    def check_constraint(self, constraint: Any) -> None:
        """Refuse an output constraint this engine cannot enforce or compile (``EngineError``
        with a ``param`` attribute naming the request field). Engines that sample tokens
        enforce them (:mod:`~nipflow_llm_server.engines.constraints`); this one does not."""
        raise ConstraintError(f"{constraint.param}: structured output is not supported by the {self.name} engine "
                              f"(use --engine transformers or vllm)", constraint.param)

    @abstractmethod
    async def chat(self, model: Any, messages: list[dict[str, Any]], params: SamplingParams) -> ChatResult:
        """Generate ``params.n`` replies to ``messages`` without blocking the event loop."""

    # -- training ---------------------------------------------------------------------

    @abstractmethod
    def resolve_hyperparameters(self, method: str, n_examples: int, given: Mapping[str, Any], seed: int) -> TrainingConfig:
        """Replace ``"auto"`` or missing hyper-parameters by the values the job will use."""

    @abstractmethod
    def train(
        self,
        parent: Any,
        config: TrainingConfig,
        train_examples: Sequence[Mapping[str, Any]],
        valid_examples: Sequence[Mapping[str, Any]],
        *,
        on_step: StepCallback,
        on_checkpoint: CheckpointCallback,
    ) -> TrainedModel:
        """Fine-tune ``parent`` (a loaded model); callbacks may raise to stop training."""

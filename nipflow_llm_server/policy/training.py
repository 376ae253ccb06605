"""Fine-tuning of the local model family: supervised (SFT) and preference (DPO).

Both are gradient descent on the weight vector of :mod:`~nipflow_llm_server.policy.features`
with Adagrad step sizes (accumulator started at 1, so the first steps are plain SGD and
often-updated weights slow down), deterministic given the job's seed.

* **SFT**: every assistant message of an example (with ``weight`` absent or 1) is a
  target; the loss is the cross-entropy of the target among a candidate pool (the
  prompt's generated candidates, the target, and up to ``NEGATIVES`` learned responses
  drawn at random: a sampled softmax). Step ``SFT_STEP * learning_rate_multiplier``.
* **DPO**: the loss of Rafailov et al. (2023),
  ``-log sigmoid(beta * ((s_w - r_w) - (s_l - r_l)))``, where ``s`` are the scores of
  the preferred (w) and non-preferred (l) responses under the model being trained and
  ``r`` under the frozen parent model (the reference); the log-partition cancels in the
  differences, so only the two scores are needed. Step
  ``DPO_STEP * learning_rate_multiplier / beta`` (beta shapes the loss, not the speed).

The step sizes trade memorisation against over-confidence: larger steps fit SFT targets
faster, but saturate the answers to *similar* prompts (a buggy twin of a trained
solution), which stops expert iteration from exploring.

``batch_size`` groups updates: gradients of a batch are computed at the same weights and
summed. Reported ``mean_token_accuracy`` is response-level: for SFT the fraction of
targets the model ranks first in the (sampled) pool, for DPO the fraction of pairs with
a positive margin. ``trained_tokens`` = epochs x the tokens of the examples (all
messages, counted with :mod:`~nipflow_llm_server.policy.tokenizer`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nipflow_llm_server.policy.candidates import Candidate, build_pool, memory_candidate
from nipflow_llm_server.policy.features import Adagrad, plan, prompt_features
from nipflow_llm_server.policy.formats import detect_format
from nipflow_llm_server.policy.model import MEMORY_LIMIT, PolicyModel, softmax
from nipflow_llm_server.policy.tokenizer import count_message_tokens, message_text

SFT_STEP = 2
DPO_STEP = 2
NEGATIVES = 16
DEFAULT_BETA = 0.1


class TrainingCancelled(Exception):
    """Raised by a callback to stop training."""


@dataclass
class SftTarget:
    prompt: list[dict]
    target: str


@dataclass
class DpoPair:
    prompt: list[dict]
    chosen: str
    rejected: str


def sft_targets(example: Mapping[str, Any]) -> list[SftTarget]:
    """Training targets of one chat SFT example."""
    messages = list(example["messages"])
    out = []
    for i, message in enumerate(messages):
        if message.get("role") == "assistant" and message.get("weight", 1) != 0:
            out.append(SftTarget(prompt=messages[:i], target=message_text(message)))
    return out


def dpo_pair(example: Mapping[str, Any]) -> DpoPair:
    """The pair of one DPO example (``input`` may be ``{"messages": [...]}`` or a list)."""
    inp = example["input"]
    prompt = list(inp["messages"] if isinstance(inp, Mapping) else inp)
    return DpoPair(
        prompt=prompt,
        chosen=message_text(example["preferred_output"][-1]),
        rejected=message_text(example["non_preferred_output"][-1]),
    )


def example_tokens(example: Mapping[str, Any]) -> int:
    """Tokens of one training example (all its messages)."""
    if "messages" in example:
        return count_message_tokens(example["messages"])
    pair = dpo_pair(example)
    return (
        count_message_tokens(pair.prompt)
        + count_message_tokens(example["preferred_output"])
        + count_message_tokens(example["non_preferred_output"])
    )


@dataclass
class TrainingConfig:
    """Resolved hyper-parameters of one fine-tuning job."""

    method: str  # "supervised" | "dpo"
    n_epochs: int
    batch_size: int
    learning_rate_multiplier: float
    seed: int
    beta: float = DEFAULT_BETA


def resolve_hyperparameters(method: str, n_examples: int, given: Mapping[str, Any], seed: int) -> TrainingConfig:
    """Replace ``"auto"`` (or missing) hyper-parameters by the values the job will use.

    ``n_epochs``: ``clamp(ceil(1000 / n_examples), 3, 10)``; ``batch_size``:
    ``clamp(n_examples // 100, 1, 32)``; ``learning_rate_multiplier``: 1.0; ``beta``: 0.1.
    """

    def pick(key: str, auto: Any) -> Any:
        value = given.get(key, "auto")
        return auto if value in (None, "auto") else value

    return TrainingConfig(
        method=method,
        n_epochs=int(pick("n_epochs", min(10, max(3, math.ceil(1000 / max(n_examples, 1)))))),
        batch_size=int(pick("batch_size", min(32, max(1, n_examples // 100)))),
        learning_rate_multiplier=float(pick("learning_rate_multiplier", 1.0)),
        seed=seed,
        beta=float(pick("beta", DEFAULT_BETA)),
    )


@dataclass
class StepMetrics:
    step: int
    train_loss: float
    train_mean_token_accuracy: float
    valid_loss: float | None = None
    valid_mean_token_accuracy: float | None = None


@dataclass
class TrainingResult:
    weights: np.ndarray
    memory: tuple[Candidate, ...]
    trained_tokens: int
    total_steps: int
    history: list[StepMetrics] = field(default_factory=list)


StepCallback = Callable[[StepMetrics, int], None]
CheckpointCallback = Callable[[StepMetrics, int, np.ndarray], None]


def _merged_memory(parent: tuple[Candidate, ...], texts: Sequence[str]) -> tuple[Candidate, ...]:
    new = [memory_candidate(t) for t in texts]
    seen: dict[str, Candidate] = {}
    for cand in (*parent, *new):
        seen.pop(cand.text, None)
        seen[cand.text] = cand  # re-learned responses move to the recent end
    return tuple(seen.values())[-MEMORY_LIMIT:]


class _SftObjective:
    def __init__(self, targets: list[SftTarget], memory: tuple[Candidate, ...]):
        self.items = [
            (detect_format(t.prompt), prompt_features(t.prompt), memory_candidate(t.target)) for t in targets
        ]
        self.memory = memory

    def __len__(self) -> int:
        return len(self.items)

    def loss_and_grad(self, i: int, weights: np.ndarray, rng: np.random.Generator):
        fmt, feats, target = self.items[i]
        allowed = [c for c in self.memory if c.kind in fmt.kinds and c.text != target.text]
        if len(allowed) > NEGATIVES:
            allowed = [allowed[j] for j in sorted(rng.choice(len(allowed), NEGATIVES, replace=False))]
        pool = build_pool(fmt, allowed, (target,))
        t = next(j for j, c in enumerate(pool) if c.text == target.text)
        p = plan(feats, pool)
        probs = softmax(p.scores(weights))
        loss = -math.log(max(probs[t], 1e-300))
        correct = float(int(np.argmax(probs)) == t)
        dscores = probs.copy()
        dscores[t] -= 1.0
        return loss, correct, p.gradient(dscores)


class _DpoObjective:
    def __init__(self, pairs: list[DpoPair], reference: np.ndarray, beta: float):
        self.beta = beta
        self.items = []
        for pair in pairs:
            pool = [memory_candidate(pair.chosen), memory_candidate(pair.rejected)]
            p = plan(prompt_features(pair.prompt), pool)
            self.items.append((p, p.scores(reference)))

    def __len__(self) -> int:
        return len(self.items)

    def loss_and_grad(self, i: int, weights: np.ndarray, rng: np.random.Generator):
        p, ref = self.items[i]
        s = p.scores(weights)
        z = self.beta * ((s[0] - ref[0]) - (s[1] - ref[1]))
        loss = float(np.logaddexp(0.0, -z))
        sig_neg = 1.0 / (1.0 + math.exp(z)) if z > -700 else 1.0
        dscores = np.array([-self.beta * sig_neg, self.beta * sig_neg])
        return loss, float(z > 0), p.gradient(dscores)


def _evaluate(objective, weights: np.ndarray, seed: int) -> tuple[float, float]:
    rng = np.random.default_rng([seed, 7])
    losses, accs = [], []
    for i in range(len(objective)):
        loss, acc, _ = objective.loss_and_grad(i, weights, rng)
        losses.append(loss)
        accs.append(acc)
    return float(np.mean(losses)), float(np.mean(accs))


def train(
    parent: PolicyModel,
    config: TrainingConfig,
    train_examples: Sequence[Mapping[str, Any]],
    valid_examples: Sequence[Mapping[str, Any]] = (),
    on_step: StepCallback | None = None,
    on_checkpoint: CheckpointCallback | None = None,
    on_memory: Callable[[tuple[Candidate, ...]], None] | None = None,
) -> TrainingResult:
    """Fine-tune ``parent`` on ``train_examples`` (see the module docstring).

    ``on_memory(memory)`` is called once with the learned responses of the new model,
    before the first step; ``on_step(metrics, total_steps)`` after every step;
    ``on_checkpoint(metrics, epoch, weights)`` at the end of each of the last three epochs
    (``weights`` is a copy). Callbacks may raise :class:`TrainingCancelled`.
    """
    rng = np.random.default_rng(config.seed % (1 << 63))
    weights = np.array(parent.weights, dtype=np.float32, copy=True)
    if config.method == "dpo":
        pairs = [dpo_pair(e) for e in train_examples]
        memory = _merged_memory(parent.memory, [t for p in pairs for t in (p.chosen, p.rejected)])
        objective = _DpoObjective(pairs, parent.weights, config.beta)
        valid = _DpoObjective([dpo_pair(e) for e in valid_examples], parent.weights, config.beta)
        step_size = DPO_STEP * config.learning_rate_multiplier / config.beta
    else:
        targets = [t for e in train_examples for t in sft_targets(e)]
        memory = _merged_memory(parent.memory, [t.target for t in targets])
        objective = _SftObjective(targets, memory)
        valid = _SftObjective([t for e in valid_examples for t in sft_targets(e)], memory)
        step_size = SFT_STEP * config.learning_rate_multiplier
    if on_memory is not None:
        on_memory(memory)
    trained_tokens = config.n_epochs * sum(example_tokens(e) for e in train_examples)
    optimizer = Adagrad(weights, step_size)
    n = len(objective)
    steps_per_epoch = max(1, math.ceil(n / config.batch_size))
    total = steps_per_epoch * config.n_epochs
    history: list[StepMetrics] = []
    step = 0
    for epoch in range(config.n_epochs):
        order = rng.permutation(n)
        for start in range(0, n, config.batch_size):
            batch = order[start : start + config.batch_size]
            losses, accs, idx, val = [], [], [], []
            for i in batch:
                loss, acc, (gi, gv) = objective.loss_and_grad(int(i), weights, rng)
                losses.append(loss)
                accs.append(acc)
                idx.append(gi)
                val.append(gv)
            optimizer.update(np.concatenate(idx), np.concatenate(val))
            step += 1
            metrics = StepMetrics(step=step, train_loss=float(np.mean(losses)), train_mean_token_accuracy=float(np.mean(accs)))
            history.append(metrics)
            if on_step is not None:
                on_step(metrics, total)
        if epoch >= config.n_epochs - 3 and on_checkpoint is not None:
            last = history[-1]
            ckpt = StepMetrics(step=step, train_loss=last.train_loss, train_mean_token_accuracy=last.train_mean_token_accuracy)
            if len(valid):
                ckpt.valid_loss, ckpt.valid_mean_token_accuracy = _evaluate(valid, weights, config.seed)
            on_checkpoint(ckpt, epoch, weights.copy())
    return TrainingResult(weights=weights, memory=memory, trained_tokens=trained_tokens, total_steps=total, history=history)

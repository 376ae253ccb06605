"""Fine-tuning jobs of the transformers engine with TRL: ``SFTTrainer`` and ``DPOTrainer``.

Job settings map onto TRL as follows: ``n_epochs`` -> ``num_train_epochs``,
``batch_size`` -> ``per_device_train_batch_size``, ``learning_rate_multiplier`` x the base
model's default learning rate (LoRA or full) -> ``learning_rate``, ``beta`` -> DPO's
``beta``, the job's ``seed`` -> ``seed`` / ``data_seed``. LoRA (PEFT, all linear layers) is
the default; ``--full-fine-tune`` trains every weight. On a CPU a job trains in bfloat16
only where the CPU has it natively, else in float32 (:func:`_precision`).

Examples are tokenized here, not by TRL, so that training sees exactly the prompt tokens
serving sees (:func:`encode_prompt`) and so that a long prompt loses its *start*, never
the completion, when an example exceeds the base model's ``max_length``:

* SFT: every assistant message with ``weight`` absent or 1 is a target; the sequence is
  the prompt before it plus the target and the end-of-turn token, and only the target
  tokens carry loss (``completion_mask``);
* DPO: the prompt (as text) and the two outputs, each ending with the end-of-turn token.
  The reference model is the parent: the base with adapters disabled for a new adapter,
  a frozen copy of the parent's adapter when it is continued, a copy for full training.

Per-step metrics (loss; SFT mean token accuracy, DPO reward accuracy) go to ``on_step``;
at the end of each of the last three epochs the model is handed to ``on_checkpoint``,
with validation metrics when there is a validation file (SFT: completion loss and token
accuracy; DPO: ``-log sigmoid(beta x (log p(preferred) - log p(rejected)))`` and the
fraction of pairs preferring the preferred output).
"""

from __future__ import annotations

import copy
import math
import tempfile
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from nipflow_llm_server.engines.base import CheckpointCallback, StepCallback, StepMetrics, TrainedModel, TrainingConfig
from nipflow_llm_server.engines.hf_models import LoadedLM, ModelStore
from nipflow_llm_server.policy.tokenizer import message_text
from nipflow_llm_server.policy.training import dpo_pair, sft_targets
from nip_core.utils.cpu import cpu_has_native_bf16

_ROLE_MAP = {"developer": "system", "tool": "user", "function": "user"}


def chat_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages as chat templates expect them: string content, common roles, ``name`` kept."""
    out = []
    for m in messages:
        item = {"role": _ROLE_MAP.get(m.get("role"), m.get("role")), "content": message_text(m)}
        if m.get("name"):
            item["name"] = m["name"]
        out.append(item)
    return out


def encode_prompt(tokenizer: Any, messages: Sequence[Mapping[str, Any]]) -> list[int]:
    """Token ids of a conversation followed by the assistant's generation prompt."""
    text = tokenizer.apply_chat_template(chat_messages(messages), tokenize=False, add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def encode_completion(tokenizer: Any, text: str) -> list[int]:
    """A reply's token ids, ending with the end-of-turn token the model must learn to emit."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) + [tokenizer.eos_token_id]


def _fit(prompt: list[int], completion: list[int], max_length: int) -> list[int]:
    """The end of ``prompt`` that fits before ``completion`` in ``max_length`` tokens."""
    keep = max(1, max_length - len(completion))
    return prompt[-keep:]


def sft_rows(tokenizer: Any, examples: Sequence[Mapping[str, Any]], max_length: int) -> list[dict[str, list[int]]]:
    rows = []
    for example in examples:
        for target in sft_targets(example):
            completion = encode_completion(tokenizer, target.target)[:max_length - 1]
            prompt = _fit(encode_prompt(tokenizer, target.prompt), completion, max_length)
            rows.append({"input_ids": prompt + completion, "completion_mask": [0] * len(prompt) + [1] * len(completion)})
    return rows


def dpo_rows(tokenizer: Any, examples: Sequence[Mapping[str, Any]], max_length: int) -> list[dict[str, Any]]:
    rows = []
    for example in examples:
        pair = dpo_pair(example)
        chosen, rejected = encode_completion(tokenizer, pair.chosen), encode_completion(tokenizer, pair.rejected)
        prompt = _fit(encode_prompt(tokenizer, pair.prompt), max(chosen, rejected, key=len), max_length)
        rows.append({
            "prompt": tokenizer.decode(prompt, skip_special_tokens=False),
            "chosen": tokenizer.decode(chosen, skip_special_tokens=False),
            "rejected": tokenizer.decode(rejected, skip_special_tokens=False),
            "_tokens": len(prompt) + len(chosen) + len(rejected),
        })
    return rows


@dataclass
class TrainedArtifact:
    """A trained model to save: a PEFT model (``kind`` lora) or a whole model (full)."""

    model: Any
    tokenizer: Any
    kind: str
    base: str
    on: Path | None


@torch.no_grad()
def sequence_logps(model: Any, ids: list[int], mask: list[int], device: str) -> tuple[float, float, int]:
    """Sum of completion log-probabilities, number of correct greedy tokens, completion length."""
    x = torch.tensor([ids], device=device)
    logits = model(input_ids=x).logits[0, :-1].float()
    targets = x[0, 1:]
    logp = torch.log_softmax(logits, -1).gather(-1, targets[:, None])[:, 0]
    keep = torch.tensor(mask[1:], device=device, dtype=torch.bool)
    correct = (logits.argmax(-1) == targets)[keep].sum()
    return float(logp[keep].sum()), int(correct), int(keep.sum())


def completion_logprob(model: Any, tokenizer: Any, messages: Sequence[Mapping[str, Any]], reply: str,
                       device: str = "cpu") -> float:
    """``log p(reply + end of turn | messages)`` under ``model`` (prompt as serving renders it)."""
    prompt, completion = encode_prompt(tokenizer, messages), encode_completion(tokenizer, reply)
    return sequence_logps(model, prompt + completion, [0] * len(prompt) + [1] * len(completion), device)[0]


def _validate(model: Any, method: str, rows: list[dict[str, Any]], tokenizer: Any, beta: float, device: str) -> tuple[float, float]:
    was_training = model.training
    model.eval()
    try:
        if method == "supervised":
            total, correct, count = 0.0, 0, 0
            for row in rows:
                lp, ok, n = sequence_logps(model, row["input_ids"], row["completion_mask"], device)
                total, correct, count = total - lp, correct + ok, count + n
            return total / max(count, 1), correct / max(count, 1)
        losses, wins = [], 0
        for row in rows:
            prompt = tokenizer(row["prompt"], add_special_tokens=False)["input_ids"]
            scores = []
            for key in ("chosen", "rejected"):
                completion = tokenizer(row[key], add_special_tokens=False)["input_ids"]
                lp, _, _ = sequence_logps(model, prompt + completion, [0] * len(prompt) + [1] * len(completion), device)
                scores.append(lp)
            margin = beta * (scores[0] - scores[1])
            losses.append(math.log1p(math.exp(-margin)) if margin > -30 else -margin)
            wins += scores[0] > scores[1]
        return sum(losses) / max(len(losses), 1), wins / max(len(rows), 1)
    finally:
        model.train(was_training)


def _callback(method: str, on_step: StepCallback, on_checkpoint: CheckpointCallback, n_epochs: int,
              make_artifact, validate):
    from transformers import TrainerCallback

    accuracy_key = "mean_token_accuracy" if method == "supervised" else "rewards/accuracies"

    class JobCallback(TrainerCallback):
        """Forwards TRL's per-step logs and end-of-epoch checkpoints to the job manager."""

        def __init__(self) -> None:
            self.last: StepMetrics | None = None
            self.history: list[StepMetrics] = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not logs or "loss" not in logs:  # the end-of-training summary has train_loss instead
                return
            metrics = StepMetrics(step=state.global_step, train_loss=float(logs["loss"]),
                                  train_mean_token_accuracy=float(logs.get(accuracy_key, 0.0)))
            self.last = metrics
            self.history.append(metrics)
            on_step(metrics, state.max_steps)

        def on_epoch_end(self, args, state, control, model=None, **kwargs):
            epoch = int(round(state.epoch or 0)) - 1
            if epoch < n_epochs - 3 or self.last is None:
                return
            ckpt = StepMetrics(step=state.global_step, train_loss=self.last.train_loss,
                               train_mean_token_accuracy=self.last.train_mean_token_accuracy)
            if validate is not None:
                ckpt.valid_loss, ckpt.valid_mean_token_accuracy = validate(model)
            on_checkpoint(ckpt, epoch, make_artifact(model))

    return JobCallback()


def _precision(device: str) -> dict[str, bool]:
    """The ``TrainingArguments`` precision of a job on ``device``.

    TRL's configs default to ``bf16=True``. On a CPU without native bfloat16 (no AVX-512 BF16
    or AMX: e.g. AMD EPYC before Zen 4) autocast emulates it, and a job runs several times
    slower than in float32 (measured on an AMD EPYC: 24 SFT steps of ``nipflow-tiny-lm``
    87 s in bf16, 12 s in fp32). So on a CPU: bf16 only where it is native. Elsewhere (CUDA)
    TRL's default stands.
    """
    if device != "cpu":
        return {}
    return {"bf16": cpu_has_native_bf16()}


def train_with_trl(
    store: ModelStore,
    parent: LoadedLM,
    config: TrainingConfig,
    train_examples: Sequence[Mapping[str, Any]],
    valid_examples: Sequence[Mapping[str, Any]],
    *,
    full: bool,
    device: str,
    on_step: StepCallback,
    on_checkpoint: CheckpointCallback,
) -> TrainedModel:
    """Fine-tune ``parent`` with TRL (see the module docstring)."""
    from datasets import Dataset
    from peft import LoraConfig

    spec = store.specs[parent.base]
    training = spec.training
    tokenizer = copy.deepcopy(parent.tokenizer)  # TRL adjusts its tokenizer; serving keeps its own
    tokenizer.padding_side = "right"
    max_length = int(training["max_length"])
    if config.method == "dpo":
        rows, valid_rows = dpo_rows(tokenizer, train_examples, max_length), dpo_rows(tokenizer, valid_examples, max_length)
        tokens = sum(r.pop("_tokens") for r in rows)
        for r in valid_rows:
            r.pop("_tokens")
    else:
        rows, valid_rows = sft_rows(tokenizer, train_examples, max_length), sft_rows(tokenizer, valid_examples, max_length)
        tokens = sum(len(r["input_ids"]) for r in rows)
    model, on, continues = store.trainable(parent, full)
    kind = "full" if full else "lora"
    peft_config = None
    if not full and not continues:
        peft_config = LoraConfig(
            r=int(training["lora_r"]), lora_alpha=int(training["lora_alpha"]), lora_dropout=0.0,
            target_modules="all-linear", modules_to_save=list(training["lora_modules_to_save"]) or None,
            task_type="CAUSAL_LM",
        )
    learning_rate = float(training[f"{kind}_learning_rate"]) * config.learning_rate_multiplier

    def make_artifact(trained: Any) -> TrainedArtifact:
        return TrainedArtifact(trained, tokenizer, kind, parent.base, on)

    validate = None
    if valid_rows:
        validate = lambda m: _validate(m, config.method, valid_rows, tokenizer, config.beta, device)  # noqa: E731
    callback = _callback(config.method, on_step, on_checkpoint, config.n_epochs, make_artifact, validate)
    with tempfile.TemporaryDirectory(prefix="nipflow-trl-") as out_dir, warnings.catch_warnings():
        # transformers 5 renamed gradient_checkpointing, TRL still defaults it to True: turning
        # it off (pointless for small models) warns about the old name on every job
        warnings.filterwarnings("ignore", category=FutureWarning)
        common = dict(
            output_dir=out_dir, num_train_epochs=config.n_epochs, per_device_train_batch_size=config.batch_size,
            learning_rate=learning_rate, lr_scheduler_type=training["lr_scheduler_type"], warmup_steps=0,
            logging_steps=1, save_strategy="no", eval_strategy="no", report_to=[], use_cpu=device == "cpu",
            gradient_checkpointing=False, seed=config.seed % (1 << 31), data_seed=config.seed % (1 << 31),
            disable_tqdm=True, dataloader_num_workers=0, max_length=None,
            **_precision(device),
        )
        if config.method == "dpo":
            from trl import DPOConfig, DPOTrainer

            args = DPOConfig(**common, beta=config.beta, precompute_ref_log_probs=False)
            ref = copy.deepcopy(model) if full else None
            trainer = DPOTrainer(model=model, ref_model=ref, args=args, train_dataset=Dataset.from_list(rows),
                                 processing_class=tokenizer, peft_config=peft_config, callbacks=[callback])
        else:
            from trl import SFTConfig, SFTTrainer

            args = SFTConfig(**common, completion_only_loss=True, packing=False)
            trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows),
                                 processing_class=tokenizer, peft_config=peft_config, callbacks=[callback])
        from transformers.trainer_callback import PrinterCallback

        trainer.remove_callback(PrinterCallback)  # it prints every step's logs to stdout
        trainer.train()
    return TrainedModel(make_artifact(trainer.model), trained_tokens=config.n_epochs * tokens, history=callback.history)

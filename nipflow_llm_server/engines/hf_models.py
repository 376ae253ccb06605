"""Base models of the transformers engine and the fine-tuned models it writes.

A base model is the built-in ``nipflow-tiny-lm`` (:mod:`~nipflow_llm_server.engines.tiny`), the
built-in real model ``--base-model smollm2-135m-instruct`` (:mod:`~nipflow_llm_server.engines.smollm2`:
fetched by the install step, de-quantised once into the data directory), or one given with
``--base-model [NAME=]PATH_OR_ID``: a local model directory or a Hugging Face id already in
the local cache. Nothing is downloaded unless ``--allow-download`` is given
(:func:`offline_mode` sets ``HF_HUB_OFFLINE=1`` and every load passes
``local_files_only=True``).

A fine-tuned model is a directory ``models/<job>/<stem>/`` of the data directory holding
``nipflow_model.json`` and either a PEFT LoRA adapter (``kind: "lora"``, the default) or a
whole model (``kind: "full"``, ``--full-fine-tune``). An adapter applies to the base model,
or to the full fine-tune named by ``on`` when it was trained on one. Served models are
plain modules (adapters merged into a copy of the weights), loaded in eval mode on the
serving device.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from nipflow_llm_server.engines.base import EngineError
from nipflow_llm_server.engines.smollm2 import NAME as SMOLLM2
from nipflow_llm_server.engines.smollm2 import materialise
from nipflow_llm_server.engines.tiny import TINY_MODEL_NAME, build_tiny_model, build_tokenizer, tiny_spec
from nip_core.settings import default_data_dir

META_FILE = "nipflow_model.json"

#: ``from_pretrained`` builds a model on the meta device inside a context that patches torch
#: for the whole process, not the thread: two loads at once (two requests, or a request and a
#: fine-tuning job) can leave one of them with meta tensors ("Cannot copy out of meta
#: tensor"). Every model built here holds this lock.
_FROM_DISK = threading.RLock()

#: Training defaults of a base model given by path or id (the tiny model's are in its JSON).
HF_TRAINING_DEFAULTS: dict[str, Any] = {
    "lora_learning_rate": 2e-4,
    "full_learning_rate": 2e-5,
    "lora_r": 16,
    "lora_alpha": 32,
    "lora_modules_to_save": [],
    "lr_scheduler_type": "linear",
    "max_length": 2048,
}


@dataclass(frozen=True)
class BaseSpec:
    """A base model: its served name, where it comes from and its training defaults."""

    name: str
    source: str  # "builtin" or a local directory or a Hugging Face id
    training: dict[str, Any]


def offline_mode(allow_download: bool) -> None:
    """Forbid hub access for the whole process unless downloads are allowed."""
    if not allow_download:
        os.environ["HF_HUB_OFFLINE"] = "1"
        os.environ["TRANSFORMERS_OFFLINE"] = "1"


def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda`` when a GPU is visible, else ``cpu``; a missing GPU is an error."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise EngineError(f"--device {device}: no CUDA device is visible to this process (torch {torch.__version__})")
    return device


def parse_base_models(values: list[str], allow_download: bool) -> dict[str, BaseSpec]:
    """The served base models: the tiny model, then each ``--base-model`` value.

    Raises
    ------
    EngineError
        A name that cannot be a model id (``:`` or whitespace), a duplicate, or a source that
        is neither a model directory nor (offline) in the Hugging Face cache.
    """
    tiny_training = {**HF_TRAINING_DEFAULTS, **tiny_spec()["training"]}
    specs = {TINY_MODEL_NAME: BaseSpec(TINY_MODEL_NAME, "builtin", tiny_training)}
    for value in values:
        if value.strip() == SMOLLM2 and SMOLLM2 not in specs:
            # a plain model directory made from the installed GGUF (the first time: ~30 s)
            specs[SMOLLM2] = BaseSpec(SMOLLM2, str(materialise(default_data_dir())), dict(HF_TRAINING_DEFAULTS))
            continue
        name, _, source = value.partition("=") if "=" in value else (value, "", value)
        name, source = name.strip(), source.strip()
        if not name or ":" in name or any(ch.isspace() for ch in name):
            raise EngineError(f"--base-model {value!r}: the model name may not be empty or contain ':' or spaces")
        if name in specs:
            raise EngineError(f"--base-model {value!r}: a base model called {name!r} is already served")
        _check_source(value, source, allow_download)
        specs[name] = BaseSpec(name, source, dict(HF_TRAINING_DEFAULTS))
    return specs


def _check_source(value: str, source: str, allow_download: bool) -> None:
    from transformers import AutoConfig

    if Path(source).is_dir():
        if not (Path(source) / "config.json").is_file():
            raise EngineError(f"--base-model {value!r}: directory {source} has no config.json")
        return
    try:
        AutoConfig.from_pretrained(source, local_files_only=not allow_download)
    except (OSError, ValueError) as exc:
        hint = "" if allow_download else " (downloads are off: pass --allow-download to fetch it)"
        raise EngineError(f"--base-model {value!r}: not a model directory nor a cached Hugging Face model{hint}: {exc}") from None


@dataclass
class LoadedLM:
    """A model ready to serve (eval mode, on the serving device) and what it was made from.

    ``kind`` is ``base``, ``lora`` or ``full``; ``path`` is the fine-tuned model's directory
    (absolute) and ``on`` the full fine-tune directory an adapter applies to, if any.
    """

    name: str
    base: str
    kind: str
    model: Any
    tokenizer: Any
    path: Path | None = None
    on: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class ModelStore:
    """Loads base and fine-tuned models and writes fine-tuned ones (see the module docstring)."""

    def __init__(self, specs: dict[str, BaseSpec], device: str, allow_download: bool):
        self.specs = specs
        self.device = device
        self.allow_download = allow_download
        self._tokenizers: dict[str, Any] = {}

    # -- base models ------------------------------------------------------------------

    def tokenizer(self, base: str) -> Any:
        if base not in self._tokenizers:
            spec = self.specs[base]
            if spec.source == "builtin":
                tok = build_tokenizer()
            else:
                from transformers import AutoTokenizer

                tok = AutoTokenizer.from_pretrained(spec.source, local_files_only=not self.allow_download)
                if tok.pad_token is None:
                    tok.pad_token = tok.eos_token
            tok.padding_side = "left"  # generation pads on the left
            self._tokenizers[base] = tok
        return self._tokenizers[base]

    def fresh_base(self, base: str) -> torch.nn.Module:
        """A new copy of a base model's weights (float32 on CPU for the tiny model)."""
        spec = self.specs[base]
        from transformers import AutoModelForCausalLM

        with _FROM_DISK:  # the tiny model is built here too: not while another load patches torch
            if spec.source == "builtin":
                return build_tiny_model()
            return AutoModelForCausalLM.from_pretrained(spec.source, local_files_only=not self.allow_download,
                                                        dtype="auto")

    def load_base(self, base: str) -> LoadedLM:
        model = self.fresh_base(base).to(self.device).eval()
        return LoadedLM(name=base, base=base, kind="base", model=model, tokenizer=self.tokenizer(base))

    # -- fine-tuned models ------------------------------------------------------------

    def _full_model(self, path: Path) -> torch.nn.Module:
        from transformers import AutoModelForCausalLM

        with _FROM_DISK:
            return AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype="auto")

    def underlying(self, base: str, on: Path | None) -> torch.nn.Module:
        """A fresh copy of what an adapter applies to: the base, or a full fine-tune."""
        return self.fresh_base(base) if on is None else self._full_model(on)

    def load(self, name: str, base: str, path: Path) -> LoadedLM:
        """A fine-tuned model from its directory, merged and ready to serve."""
        meta = json.loads((path / META_FILE).read_text())
        on = (path / meta["on"]).resolve() if meta.get("on") else None
        if meta["kind"] == "full":
            model = self._full_model(path)
        else:
            from peft import PeftModel

            with _FROM_DISK:
                model = PeftModel.from_pretrained(self.underlying(base, on), path).merge_and_unload()
        model = model.to(self.device).eval()
        return LoadedLM(name=name, base=base, kind=meta["kind"], model=model, tokenizer=self.tokenizer(base),
                        path=path, on=on)

    def trainable(self, parent: LoadedLM, full: bool) -> tuple[torch.nn.Module, Path | None, bool]:
        """A new trainable copy of ``parent`` for a job: ``(model, on, continues_adapter)``.

        Full fine-tuning starts from a copy of the served (merged) parent. LoRA training
        continues the parent's own adapter when it has one (so every adapter applies to the
        base, or to the same full fine-tune, and stays servable by vLLM), else starts a new
        adapter on the parent.
        """
        if full:
            return copy.deepcopy(parent.model), None, False
        if parent.kind == "lora":
            from peft import PeftModel

            with _FROM_DISK:
                model = PeftModel.from_pretrained(self.underlying(parent.base, parent.on), parent.path,
                                                  is_trainable=True)
            return model, parent.on, True
        if parent.kind == "full":
            return self._full_model(parent.path), parent.path, False
        return self.fresh_base(parent.base), None, False

    @staticmethod
    def save(model: Any, tokenizer: Any, kind: str, base: str, on: Path | None, target: Path) -> None:
        """Write a trained model to ``target`` atomically (temp directory, then rename)."""
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        try:
            if kind == "lora":
                # a DPO run on a continued adapter also holds its frozen "ref" copy: not saved
                model.save_pretrained(tmp, selected_adapters=["default"])
            else:
                model.save_pretrained(tmp)
                tokenizer.save_pretrained(tmp)
            # relative, so that a data directory can be moved
            meta = {"kind": kind, "base": base, "on": os.path.relpath(on, target) if on else None}
            (tmp / META_FILE).write_text(json.dumps(meta))
            if target.exists():  # a restarted job writes its checkpoints again
                shutil.rmtree(target)
            os.replace(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

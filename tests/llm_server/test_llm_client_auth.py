"""The client factory, and Bearer-key auth of the server."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest

from nip_core.llm.client import LOCAL_PLACEHOLDER_KEY, make_openai_client
from nip_core.llm.errors import MissingApiKeyError
from nipflow_llm_server.server.cli import EXIT_USAGE, main
from nipflow_llm_server.testing import local_api_server

KEY = "sk-test-secret-0123456789"


def test_explicit_arguments_win_over_the_environment(monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:1/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    client = make_openai_client("http://localhost:9/v1", "sk-arg", max_retries=7, timeout=3.0)
    assert (str(client.base_url), client.api_key, client.max_retries, client.timeout) == ("http://localhost:9/v1/", "sk-arg", 7, 3.0)
    client = make_openai_client()
    assert (str(client.base_url), client.api_key, client.max_retries) == ("http://127.0.0.1:1/v1/", "sk-env", 5)


def test_local_server_gets_a_placeholder_key_and_remote_needs_one(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    assert make_openai_client("http://127.0.0.1:8765/v1").api_key == LOCAL_PLACEHOLDER_KEY
    assert make_openai_client("http://localhost:8765/v1").api_key == LOCAL_PLACEHOLDER_KEY
    with pytest.raises(MissingApiKeyError, match="OPENAI_API_KEY"):
        make_openai_client("https://api.example.com/v1")
    with pytest.raises(MissingApiKeyError, match="the OpenAI API"):
        make_openai_client()


@pytest.mark.e2e
def test_api_key_is_required_and_never_exposed(tmp_path):
    with local_api_server(tmp_path, api_key=KEY, job_time_scale=0.02) as server:
        messages = [{"role": "user", "content": "hi"}]
        for key in ("sk-wrong", None):
            with pytest.raises(openai.AuthenticationError) as info:
                make_openai_client(server.base_url, key, max_retries=0).chat.completions.create(model="gpt-4o-mini", messages=messages)
            assert info.value.status_code == 401 and info.value.code == "invalid_api_key"
            assert KEY not in info.value.message
        reply = server.client().chat.completions.create(model="gpt-4o-mini", messages=messages, seed=1)
        assert reply.choices[0].message.content
        # health is open; the admin endpoint needs the key
        with urllib.request.urlopen(server.root_url + "/health", timeout=5) as resp:
            assert json.loads(resp.read())["status"] == "ok"
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(server.root_url + "/admin/faults", timeout=5)
        assert info.value.code == 401
        assert server.fault_status()["injected"] == {}
        cmdline = Path(f"/proc/{server.pid}/cmdline").read_bytes()
        assert KEY.encode() not in cmdline
    assert KEY not in (tmp_path / "api_server" / "server.log").read_text()


@pytest.mark.parametrize(
    "argv",
    [["--faults", "{not json"], ["--faults", '{"endpoints": {"*": {"rate_500": 2}}}'], ["--job-time-scale", "-1"]],
)
def test_cli_rejects_a_bad_configuration(tmp_path, argv, capsys):
    assert main(["--port", "0", "--data-dir", str(tmp_path), *argv]) == EXIT_USAGE
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"nipflow api-server: error: {argv[0]}")


def test_a_body_over_the_upload_limit_is_a_413_and_nothing_is_stored(tmp_path):
    import httpx
    import openai

    with local_api_server(tmp_path, max_upload_mb=0.01) as server:  # 10,485 bytes
        client = server.client(max_retries=0)
        line = json.dumps({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]})
        small = client.files.create(file=("small.jsonl", (line + "\n").encode() * 20), purpose="fine-tune")
        with pytest.raises(openai.APIStatusError) as declared:
            client.files.create(file=("big.jsonl", (line + "\n").encode() * 200), purpose="fine-tune")
        # the same without a Content-Length: cut off while it streams
        chunks = (b"x" * 4096 for _ in range(8))
        streamed = httpx.post(f"{server.base_url}/files", content=chunks, timeout=30,
                              headers={"content-type": "multipart/form-data; boundary=b"})
        assert [f.id for f in client.files.list()] == [small.id]
    assert declared.value.status_code == 413 and declared.value.body["code"] == "file_too_large"
    assert "--max-upload-mb" in declared.value.body["message"]
    assert streamed.status_code == 413 and streamed.json()["error"]["code"] == "file_too_large"

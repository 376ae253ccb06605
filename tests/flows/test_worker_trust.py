"""What a flow run may point a worker at: API base URLs that get its key, run stores it writes.

Flow parameters come from whoever can start a flow run; the OpenAI key and the files are the
worker's. Before this check a run with ``settings_overrides.openai_base_url`` set to any host
got the worker's key sent there.
"""

from __future__ import annotations

import pytest

from flows import secret_blocks
from flows.parameters import ExperimentParameters
from flows.secret_blocks import check_api_base_url, check_run_store_allowed

EVIL = "https://collector.example/v1"


@pytest.fixture
def worker_env(monkeypatch):
    for name in ("OPENAI_BASE_URL", "NIPFLOW_ALLOWED_API_BASE_URLS", "NIPFLOW_ALLOWED_RUNS_DIRS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-worker-key-3c9d")
    return monkeypatch


def _cv_params(tmp_path, **settings_overrides) -> ExperimentParameters:
    return ExperimentParameters(scenario="code_validation", trainer="pure_text_ei", run_id="trust",
                                runs_dir=str(tmp_path / "runs"), settings_overrides=settings_overrides)


def test_a_flow_run_cannot_send_the_workers_key_to_another_host(worker_env, tmp_path):
    asked = []
    worker_env.setattr(secret_blocks, "openai_api_key", lambda: asked.append(1))
    params = _cv_params(tmp_path, openai_base_url=EVIL)
    with pytest.raises(ValueError) as info:
        params.run_spec().experiment_settings()  # what the worker builds the trainer with
    message = str(info.value)
    assert message.startswith(f"settings_overrides.openai_base_url: '{EVIL}' is not an API base URL")
    assert "NIPFLOW_ALLOWED_API_BASE_URLS" in message and "sk-worker-key" not in message
    assert asked == []  # refused before the key was even read


@pytest.mark.parametrize("url", ["http://127.0.0.1:8123/v1", "http://localhost:9/v1", "http://[::1]:80/v1",
                                 "https://api.openai.com/v1", "https://api.openai.com/v1/"])
def test_loopback_and_openai_are_trusted_by_default(worker_env, url):
    check_api_base_url(url)


def test_the_workers_own_url_and_its_allowlist_are_trusted_and_nothing_beside_them(worker_env, tmp_path):
    worker_env.setenv("OPENAI_BASE_URL", "https://gateway.internal/openai/v1")
    worker_env.setenv("NIPFLOW_ALLOWED_API_BASE_URLS", "https://proxy.example, https://other.example/v1")
    for url in ("https://gateway.internal/openai/v1", "https://proxy.example/v1", "https://other.example/v1"):
        check_api_base_url(url)
    for url in ("https://proxy.example.attacker.net/v1", "https://other.example/v10", "http://0.0.0.0:80/v1",
                "https://gateway.internal/other"):
        with pytest.raises(ValueError, match="is not an API base URL this worker sends its key to"):
            check_api_base_url(url)
    params = _cv_params(tmp_path, openai_base_url="https://proxy.example/v1")
    settings = params.run_spec().experiment_settings()  # what the worker builds the trainer with
    assert settings.openai_base_url == "https://proxy.example/v1"
    assert settings.openai_api_key.get_secret_value() == "sk-worker-key-3c9d"


def test_run_stores_are_limited_to_the_workers_allowlist_when_it_has_one(worker_env, tmp_path):
    check_run_store_allowed(str(tmp_path / "anywhere"))  # no allowlist: the worker trusts its flow runs
    store = tmp_path / "store"
    store.mkdir()
    worker_env.setenv("NIPFLOW_ALLOWED_RUNS_DIRS", f"{store},s3://team-bucket/runs")
    check_run_store_allowed(str(store / "runs"))
    check_run_store_allowed("s3://team-bucket/runs/exp1")
    for outside in (str(tmp_path / "elsewhere"), f"{store}/../elsewhere", "s3://team-bucket/runs-other",
                    "s3://other-bucket/runs"):
        with pytest.raises(ValueError, match=r"^runs_dir: .* is outside the run stores this worker writes to"):
            check_run_store_allowed(outside)
    (store / "link").symlink_to(tmp_path)
    with pytest.raises(ValueError, match="outside the run stores"):
        check_run_store_allowed(str(store / "link" / "runs"))
    params = _cv_params(tmp_path)  # runs_dir tmp_path/runs: outside
    with pytest.raises(ValueError, match="^runs_dir: "):
        params.run_spec().experiment_settings()  # what the worker builds the trainer with

"""The text agents' API client: how long it waits for a response."""

from __future__ import annotations

from nip_core.parameters import HyperParameters
from nip_core.scenarios.registry import build_scenario_instance
from nip_core.settings import ExperimentSettings


def client_of(settings: ExperimentSettings):
    hp = HyperParameters(scenario="code_validation", trainer="pure_text_ei", dataset="nipflow-cv")
    return build_scenario_instance(hp, settings).extras["client"]()


def test_a_request_may_take_ten_minutes_by_default_and_the_setting_changes_it(tmp_path):
    # a local CPU model answering a batch of 16 rollouts on a busy 2-core machine took over the
    # old 60 s, and every retry re-sent the request to the server still working on it
    base = dict(runs_dir=str(tmp_path), openai_base_url="http://127.0.0.1:9/v1", use_wandb=False)
    assert client_of(ExperimentSettings(**base)).timeout == 600.0
    assert client_of(ExperimentSettings(**base, api_request_timeout_s=42.0)).timeout == 42.0

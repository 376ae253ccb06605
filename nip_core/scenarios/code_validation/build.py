"""Builder of the code-validation scenario (datasets, protocol, environments, text agents)."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from nip_core.agents.base import Agent
from nip_core.agents.pure_text import PureTextSharedModelGroup, PureTextWholeAgent
from nip_core.protocols import build_protocol_handler
from nip_core.scenarios.code_validation.dataset import CodeValidationDataset
from nip_core.scenarios.code_validation.environment import CodeValidationEnvironment
from nip_core.scenarios.registry import ScenarioInstance, register_scenario


class GroupConsistencyError(ValueError):
    """Members of a shared model group disagree on model, freezing or from-scratch."""


class LazyClient:
    """Creates the openai client on first use (asking the local stand-in for a server if no API is set)."""

    def __init__(self, settings: Any):
        self.settings = settings
        self._client = None
        self._lock = threading.Lock()

    def base_url(self) -> str:
        url = self.settings.openai_base_url or os.environ.get("OPENAI_BASE_URL")
        if url:
            return url
        from nip_core.llm.local_server import local_server_url

        data_dir = self.settings.local_api_server_dir or str(Path(self.settings.runs_dir) / ".llm-server")
        return local_server_url(Path(data_dir))

    def __call__(self) -> Any:
        with self._lock:
            if self._client is None:
                from nip_core.llm.client import make_openai_client

                key = self.settings.openai_api_key
                self._client = make_openai_client(self.base_url(),
                                                  key.get_secret_value() if key is not None else None,
                                                  timeout=self.settings.api_request_timeout_s)
            return self._client


@register_scenario("code_validation")
def build_code_validation(hyper_params: Any, settings: Any, **_: Any) -> ScenarioInstance:
    """Datasets, protocol handler, environments, text agents and shared model groups."""
    handler = build_protocol_handler(hyper_params)
    opts = hyper_params.dataset_options
    train = CodeValidationDataset.from_name(hyper_params.dataset, "train", max_size=opts.max_train_size)
    test = CodeValidationDataset.from_name(hyper_params.dataset, "test", max_size=opts.max_test_size)
    client = LazyClient(settings)
    members: dict[str, list[str]] = {}
    for agent in handler.agent_names:
        p = hyper_params.agent_params(agent)
        members.setdefault(getattr(p, "shared_model_group", None) or agent, []).append(agent)
    groups: dict[str, PureTextSharedModelGroup] = {}
    agents: dict[str, Agent] = {}  # each text agent's PureTextWholeAgent in Agent.whole
    for group, names in members.items():
        ps = [hyper_params.agent_params(a) for a in names]
        for field in ("model_name", "freeze_agent", "fine_tune_from_scratch"):
            if len({getattr(p, field) for p in ps}) > 1:
                raise GroupConsistencyError(f"shared model group '{group}': agents {names} differ in '{field}'")
        groups[group] = g = PureTextSharedModelGroup(group, names, ps[0], client,
                                                      max_attempts=hyper_params.text_rl.fine_tune_max_attempts,
                                                      n_epochs=hyper_params.text_rl.fine_tune_n_epochs)
        for a in names:
            agents[a] = Agent(whole=PureTextWholeAgent(a, hyper_params.agent_params(a), client,
                                                       lambda g=g: g.model_name))
    return ScenarioInstance(train_dataset=train, test_dataset=test, protocol_handler=handler, agents=agents,
                            train_environment=CodeValidationEnvironment(handler, train),
                            test_environment=CodeValidationEnvironment(handler, test),
                            shared_model_groups=groups, extras={"client": client})

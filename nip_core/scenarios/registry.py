"""Scenario registry: how to build the components of an experiment for a scenario.

Each scenario registers a builder ``fn(hyper_params, settings) -> ScenarioInstance`` with
``@register_scenario("graph_isomorphism")``. Trainers call
:func:`build_scenario_instance`; no if/elif over scenario names anywhere.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from nip_core.agents.base import Agent

SCENARIO_REGISTRY: dict[str, Callable[..., "ScenarioInstance"]] = {}

_SCENARIO_MODULES = {
    "graph_isomorphism": "nip_core.scenarios.graph_isomorphism.build",
    "code_validation": "nip_core.scenarios.code_validation.build",
}


@dataclass
class ScenarioInstance:
    """The components of an experiment (datasets, protocol, agents, environments...).

    Scenario builders fill what their trainers need; unused fields stay ``None``.
    ``agents`` maps every agent name to its :class:`~nip_core.agents.base.Agent` (the
    parts of a TensorDict agent, or the ``whole`` of a text agent); the ``combined_*``
    fields are the modules that run those parts of all agents together.
    """

    train_dataset: Any
    test_dataset: Any
    protocol_handler: Any
    agents: dict[str, "Agent"] = field(default_factory=dict)
    train_environment: Any = None
    test_environment: Any = None
    combined_body: Any = None
    combined_policy_body: Any = None
    combined_value_body: Any = None
    combined_policy_head: Any = None
    combined_value_head: Any = None
    combined_whole: Any = None
    shared_model_groups: dict[str, Any] | None = None
    extras: dict[str, Any] = field(default_factory=dict)

    def whole_agents(self) -> dict[str, Any]:
        """``{name: agent.whole}`` of every agent (the text agents that generate replies)."""
        missing = [name for name, agent in self.agents.items() if agent.whole is None]
        if missing:
            raise TypeError(f"agent '{missing[0]}' has no whole part (a TensorDict agent acts through its parts)")
        return {name: agent.whole for name, agent in self.agents.items()}


def register_scenario(name: str):
    def decorator(fn):
        if name in SCENARIO_REGISTRY and SCENARIO_REGISTRY[name] is not fn:
            raise ValueError(f"scenario '{name}' is already registered")
        SCENARIO_REGISTRY[name] = fn
        return fn

    return decorator


def build_scenario_instance(hyper_params, settings, **kwargs) -> ScenarioInstance:
    """Build the scenario components for ``hyper_params.scenario``."""
    module = _SCENARIO_MODULES.get(hyper_params.scenario)
    if module is not None and hyper_params.scenario not in SCENARIO_REGISTRY:
        importlib.import_module(module)
    try:
        builder = SCENARIO_REGISTRY[hyper_params.scenario]
    except KeyError:
        raise KeyError(f"no builder registered for scenario '{hyper_params.scenario}'") from None
    return builder(hyper_params, settings, **kwargs)

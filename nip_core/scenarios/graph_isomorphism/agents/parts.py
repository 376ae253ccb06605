"""Building the graph-isomorphism agents as :class:`~nip_core.agents.base.Agent`\\ s.

Which parts an agent gets depends on the trainer (docs/behaviour.md#b20): policy heads for
RL trainers, value heads with a critic, one body shared by the heads or — with
``rl.use_shared_body = False`` and a critic — separate policy and value bodies, solo heads
for the solo-agent trainer and ``pretrain_agents``. Scripted agents get a zero body and a
constant value head, with a uniform policy head (random agents) or the oracle prover's
(:class:`~nip_core.scenarios.graph_isomorphism.agents.heads.OracleProverHead`).

The classes used are looked up by base class: ``part_classes`` given to the builder
first, then the per-scenario registry ``GRAPH_ISOMORPHISM_PART_CLASSES`` (the stock
architecture). This is the hook for a new architecture, see :mod:`nip_core.agents.base`.
Every agent's parts are built under the RNG seed ``agent_init_seed(seed, agent_index)``,
so an agent's initial weights depend only on the seed and its position.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from nip_core.agents.base import (
    Agent,
    AgentBody,
    AgentPart,
    AgentPolicyHead,
    AgentValueHead,
    SoloAgentHead,
    TensorDictAgentPartMixin,
)
from nip_core.agents.mlp import agent_init_seed, orthogonal_init
from nip_core.parameters.agents import OracleProverParameters
from nip_core.scenarios.graph_isomorphism.agents.body import GraphIsomorphismAgentBody
from nip_core.scenarios.graph_isomorphism.agents.heads import (
    ConstantValueHead,
    GraphIsomorphismPolicyHead,
    GraphIsomorphismSoloHead,
    GraphIsomorphismValueHead,
    OracleProverHead,
    RandomAgentBody,
    RandomPolicyHead,
)

#: The part class used for each base, for every non-random agent (the stock architecture).
GRAPH_ISOMORPHISM_PART_CLASSES: dict[type[AgentPart], type[AgentPart]] = {
    AgentBody: GraphIsomorphismAgentBody,
    AgentPolicyHead: GraphIsomorphismPolicyHead,
    AgentValueHead: GraphIsomorphismValueHead,
    SoloAgentHead: GraphIsomorphismSoloHead,
}


def resolve_part_classes(part_classes: Mapping[type, type] | None = None) -> dict[type, type]:
    """The registry updated with ``part_classes``, checked.

    Raises
    ------
    TypeError
        If a key is not one of the registry's bases, or a class does not subclass its base
        and :class:`~nip_core.agents.base.TensorDictAgentPartMixin`.
    """
    classes = dict(GRAPH_ISOMORPHISM_PART_CLASSES)
    for base, cls in (part_classes or {}).items():
        if base not in GRAPH_ISOMORPHISM_PART_CLASSES:
            allowed = [b.__name__ for b in GRAPH_ISOMORPHISM_PART_CLASSES]
            raise TypeError(f"part_classes: key {getattr(base, '__name__', base)!r} is not one of {allowed}")
        if not (isinstance(cls, type) and issubclass(cls, base) and issubclass(cls, TensorDictAgentPartMixin)):
            raise TypeError(f"part_classes[{base.__name__}]: {cls!r} must subclass {base.__name__} and "
                            "TensorDictAgentPartMixin")
        classes[base] = cls
    return classes


def agent_part_flags(hyper_params: Any, trainer_type: str, use_critic: bool) -> dict[str, bool]:
    """Which parts to build: ``shared_body``, ``use_critic``, ``policy``, ``solo``."""
    if trainer_type == "solo_agent":
        return dict(shared_body=True, use_critic=False, policy=False, solo=True)
    if trainer_type != "rl":
        raise ValueError(f"trainer_type must be 'rl' or 'solo_agent', not {trainer_type!r}")
    return dict(shared_body=hyper_params.rl.use_shared_body or not use_critic, use_critic=use_critic,
                policy=True, solo=bool(hyper_params.pretrain_agents))


def build_agents(hyper_params: Any, settings: Any, protocol_handler: Any, max_nodes: int, *,
                 trainer_type: str = "rl", use_critic: bool = True,
                 part_classes: Mapping[type, type] | None = None) -> dict[str, Agent]:
    """Every agent of the protocol as an ``Agent``, by name, in the protocol's order.

    Parameters
    ----------
    hyper_params, settings, protocol_handler
        The experiment.
    max_nodes
        Number of node slots per graph.
    trainer_type
        ``"rl"`` or ``"solo_agent"``.
    use_critic
        Build value heads (RL trainers that train a critic).
    part_classes
        Classes replacing the registry's for some bases (``{AgentBody: MyBody}``).
    """
    classes = resolve_part_classes(part_classes)
    flags = agent_part_flags(hyper_params, trainer_type, use_critic)
    shared, critic, policy, solo = flags["shared_body"], flags["use_critic"], flags["policy"], flags["solo"]
    agents: dict[str, Agent] = {}
    for index, name in enumerate(protocol_handler.agent_names):
        params = hyper_params.agent_params(name)

        def make(cls: type) -> AgentPart:
            return cls(hyper_params, settings, name, protocol_handler, max_nodes=max_nodes)

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(agent_init_seed(hyper_params.seed, index))
            if params.is_scripted:
                if solo:
                    raise ValueError(f"agents.{name}: {params.kind} agents cannot be trained as solo agents")
                head = OracleProverHead if isinstance(params, OracleProverParameters) else RandomPolicyHead
                agents[name] = Agent(body=make(RandomAgentBody),
                                     policy_head=make(head) if policy else None,
                                     value_head=make(ConstantValueHead) if critic else None)
                continue
            body = make(classes[AgentBody])
            value_body = make(classes[AgentBody]) if critic and not shared else None
            policy_head = make(classes[AgentPolicyHead]) if policy else None
            value_head = make(classes[AgentValueHead]) if critic else None
            solo_head = make(classes[SoloAgentHead]) if solo else None
            if params.use_orthogonal_initialisation:
                for part in (body, value_body, policy_head, value_head, solo_head):
                    if part is not None:
                        orthogonal_init(part, params.orthogonal_initialisation_gain)
            agents[name] = Agent(body=body if shared else None, policy_body=None if shared else body,
                                 value_body=value_body, policy_head=policy_head, value_head=value_head,
                                 solo_head=solo_head)
    return agents

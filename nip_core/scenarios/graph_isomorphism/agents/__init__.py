"""Graph-isomorphism agents: GNN bodies, heads, their ``Agent``\\ s and combined (all-agent) module."""

from nip_core.scenarios.graph_isomorphism.agents.body import GraphIsomorphismAgentBody
from nip_core.scenarios.graph_isomorphism.agents.combined import (
    CombinedAgents,
    build_combined_agents,
)
from nip_core.scenarios.graph_isomorphism.agents.heads import (
    ConstantValueHead,
    GraphIsomorphismPolicyHead,
    GraphIsomorphismSoloHead,
    GraphIsomorphismValueHead,
    RandomAgentBody,
    RandomPolicyHead,
)
from nip_core.scenarios.graph_isomorphism.agents.parts import GRAPH_ISOMORPHISM_PART_CLASSES, build_agents

__all__ = ["GRAPH_ISOMORPHISM_PART_CLASSES", "CombinedAgents", "ConstantValueHead", "GraphIsomorphismAgentBody",
           "GraphIsomorphismPolicyHead", "GraphIsomorphismSoloHead", "GraphIsomorphismValueHead", "RandomAgentBody",
           "RandomPolicyHead", "build_agents", "build_combined_agents"]

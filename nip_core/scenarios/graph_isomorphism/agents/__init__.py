"""Graph-isomorphism agents: GNN bodies, heads and their combined (all-agent) wrappers."""

from nip_core.scenarios.graph_isomorphism.agents.body import GraphIsomorphismAgentBody
from nip_core.scenarios.graph_isomorphism.agents.combined import (
    CombinedAgents,
    build_combined_agents,
)
from nip_core.scenarios.graph_isomorphism.agents.heads import (
    GraphIsomorphismPolicyHead,
    GraphIsomorphismSoloHead,
    GraphIsomorphismValueHead,
)

__all__ = ["CombinedAgents", "GraphIsomorphismAgentBody", "GraphIsomorphismPolicyHead",
           "GraphIsomorphismSoloHead", "GraphIsomorphismValueHead", "build_combined_agents"]

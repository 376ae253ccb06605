"""Agents: nip's agent layer (:mod:`nip_core.agents.base`), shared building blocks and text agents."""

from nip_core.agents.base import (
    Agent,
    AgentBody,
    AgentHead,
    AgentPart,
    AgentPolicyHead,
    AgentValueHead,
    SoloAgentHead,
    TensorDictAgentPartMixin,
)
from nip_core.agents.pure_text import PureTextWholeAgent

__all__ = ["Agent", "AgentBody", "AgentHead", "AgentPart", "AgentPolicyHead", "AgentValueHead",
           "PureTextWholeAgent", "SoloAgentHead", "TensorDictAgentPartMixin"]

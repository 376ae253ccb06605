"""Graph-isomorphism heads: node selector + decider (policy), value, solo, random and oracle ones.

Every part is built as ``cls(hyper_params, settings, agent_name, protocol_handler,
max_nodes=...)`` (:mod:`nip_core.agents.base`); the sizes come from the protocol (rounds,
the agent's visible channels), ``hyper_params.message_size`` and ``d_representation``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from nip_core.agents.base import (
    AgentBody,
    AgentPolicyHead,
    AgentValueHead,
    SoloAgentHead,
    TensorDictAgentPartMixin,
)
from nip_core.agents.mlp import make_mlp, one_hot_round
from nip_core.scenarios.graph_isomorphism.wl import wl_colours


class GraphIsomorphismPolicyHead(TensorDictAgentPartMixin, AgentPolicyHead):
    """Per-node message logits and (verifiers only) decision logits.

    Outputs ``node_selected_logits (B, visible_channels, position, 2 * N)`` and
    ``decision_logits (B, 3)`` (zeros for non-verifiers: uniform, never used).
    """

    in_keys = ("graph_level_repr", "node_level_repr", "round")
    out_keys = ("node_selected_logits", "decision_logits")

    def __init__(self, hyper_params, settings, agent_name: str, protocol_handler, *, max_nodes: int):
        super().__init__(hyper_params, settings, agent_name, protocol_handler)
        p = self.agent_params
        d_representation = hyper_params.d_representation
        self.num_visible_channels = len(self.visible_channel_indices)
        self.message_size = hyper_params.message_size
        self.max_rounds = protocol_handler.max_message_rounds
        self.include_round = p.include_round_in_decider
        self.node_selector = make_mlp(d_representation, p.d_node_selector,
                                      self.num_visible_channels * self.message_size,
                                      p.num_node_selector_layers, p.activation_function)
        self.decider = None
        if self.has_decider:
            d_in = 2 * d_representation + (self.max_rounds + 1 if self.include_round else 0)
            self.decider = make_mlp(d_in, p.d_decider, 3, p.num_decider_layers, p.activation_function)

    def forward(self, graph_repr: Tensor, node_repr: Tensor, round_: Tensor) -> tuple[Tensor, Tensor]:
        B = graph_repr.shape[0]
        node_logits = self.node_selector(node_repr)  # (B, 2, N, C*M)
        node_logits = node_logits.reshape(B, -1, self.num_visible_channels * self.message_size)
        node_logits = node_logits.transpose(1, 2).reshape(B, self.num_visible_channels, self.message_size, -1)
        if self.decider is None:
            return node_logits, torch.zeros(B, 3, device=graph_repr.device)
        features = graph_repr.reshape(B, -1)
        if self.include_round:
            features = torch.cat([features, one_hot_round(round_, self.max_rounds)], -1)
        return node_logits, self.decider(features)


class GraphIsomorphismValueHead(TensorDictAgentPartMixin, AgentValueHead):
    """Graph-level MLP (+ one-hot round) giving the agent's value ``(B, 1)``."""

    in_keys = ("graph_level_repr", "round")
    out_keys = ("value",)

    def __init__(self, hyper_params, settings, agent_name: str, protocol_handler, *, max_nodes: int):
        super().__init__(hyper_params, settings, agent_name, protocol_handler)
        p = self.agent_params
        self.max_rounds = protocol_handler.max_message_rounds
        self.include_round = p.include_round_in_value
        d_in = 2 * hyper_params.d_representation + (self.max_rounds + 1 if self.include_round else 0)
        self.mlp = make_mlp(d_in, p.d_value, 1, p.num_value_layers, p.activation_function)

    def forward(self, graph_repr: Tensor, round_: Tensor) -> Tensor:
        features = graph_repr.reshape(graph_repr.shape[0], -1)
        if self.include_round:
            features = torch.cat([features, one_hot_round(round_, self.max_rounds)], -1)
        return self.mlp(features)


class GraphIsomorphismSoloHead(TensorDictAgentPartMixin, SoloAgentHead):
    """Graph-level MLP giving 2 logits (not isomorphic / isomorphic): supervised classification."""

    in_keys = ("graph_level_repr",)
    out_keys = ("decision_logits",)

    def __init__(self, hyper_params, settings, agent_name: str, protocol_handler, *, max_nodes: int):
        super().__init__(hyper_params, settings, agent_name, protocol_handler)
        p = self.agent_params
        self.mlp = make_mlp(2 * hyper_params.d_representation, p.d_decider, 2, p.num_decider_layers,
                            p.activation_function)

    def forward(self, graph_repr: Tensor) -> Tensor:
        return self.mlp(graph_repr.reshape(graph_repr.shape[0], -1))


class RandomAgentBody(TensorDictAgentPartMixin, AgentBody):
    """Zero representations; one dummy parameter so optimisers and devices still work."""

    in_keys = ("x",)
    out_keys = ("graph_level_repr", "node_level_repr")

    def __init__(self, hyper_params, settings, agent_name: str, protocol_handler, *, max_nodes: int):
        super().__init__(hyper_params, settings, agent_name, protocol_handler)
        self.dummy = nn.Parameter(torch.zeros(()))
        self.max_nodes, self.d = max_nodes, self.d_representation

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        B = x.shape[0]
        zero = self.dummy * 0
        return (zero + torch.zeros(B, 2, self.d, device=x.device),
                zero + torch.zeros(B, 2, self.max_nodes, self.d, device=x.device))


class RandomPolicyHead(TensorDictAgentPartMixin, AgentPolicyHead):
    """All-zero logits: uniform over nodes and decisions."""

    in_keys = ("graph_level_repr",)
    out_keys = ("node_selected_logits", "decision_logits")

    def __init__(self, hyper_params, settings, agent_name: str, protocol_handler, *, max_nodes: int):
        super().__init__(hyper_params, settings, agent_name, protocol_handler)
        self.dummy = nn.Parameter(torch.zeros(()))
        self.shape = (len(self.visible_channel_indices), hyper_params.message_size, 2 * max_nodes)

    def forward(self, graph_repr: Tensor) -> tuple[Tensor, Tensor]:
        B = graph_repr.shape[0]
        zero = self.dummy * 0
        return (zero + torch.zeros(B, *self.shape, device=graph_repr.device),
                zero + torch.zeros(B, 3, device=graph_repr.device))


class ConstantValueHead(TensorDictAgentPartMixin, AgentValueHead):
    """Value 0 for every state."""

    in_keys = ("graph_level_repr",)
    out_keys = ("value",)

    def __init__(self, hyper_params, settings, agent_name: str, protocol_handler, *, max_nodes: int):
        super().__init__(hyper_params, settings, agent_name, protocol_handler)
        self.dummy = nn.Parameter(torch.zeros(()))

    def forward(self, graph_repr: Tensor) -> Tensor:
        return self.dummy * 0 + torch.zeros(graph_repr.shape[0], 1, device=graph_repr.device)


class OracleProverHead(TensorDictAgentPartMixin, AgentPolicyHead):
    """The message logits of an oracle prover (:class:`~nip_core.parameters.agents.OracleProverParameters`).

    The verifier's latest node ``v`` is the largest entry of the agent's ``message`` (any
    positive-scale normalisation keeps it). The candidates are the real nodes of the other
    graph whose joint colour-refinement colour equals ``v``'s when ``y`` is 1 (isomorphic) and
    differs from it when ``y`` is 0; if there is none, every real node of that graph. Logits
    are 0 for candidates and a large negative value otherwise, the same for every channel and
    position the agent sees; decision logits are zeros (a prover never decides).
    """

    in_keys = ("adjacency", "node_mask", "message", "y")
    out_keys = ("node_selected_logits", "decision_logits")

    def __init__(self, hyper_params, settings, agent_name: str, protocol_handler, *, max_nodes: int):
        super().__init__(hyper_params, settings, agent_name, protocol_handler)
        self.dummy = nn.Parameter(torch.zeros(()), requires_grad=False)
        self.max_nodes = max_nodes

    def forward(self, adjacency: Tensor, node_mask: Tensor, message: Tensor,
                y: Tensor) -> tuple[Tensor, Tensor]:
        B, C, M, N = message.shape[0], message.shape[1], message.shape[2], self.max_nodes
        colours = torch.from_numpy(wl_colours(adjacency.detach().cpu().numpy(),
                                              node_mask.detach().cpu().numpy())).to(message.device)
        flat_colours = colours.reshape(B, 1, 1, 2 * N)
        latest = message.reshape(B, C, M, 2 * N).argmax(-1)  # (B, C, M): graph * N + node
        own_colour = flat_colours.expand(B, C, M, 2 * N).gather(-1, latest.unsqueeze(-1))  # (B, C, M, 1)
        slot_graph = torch.arange(2 * N, device=message.device) // N
        other_graph = slot_graph.view(1, 1, 1, -1) != (latest // N).unsqueeze(-1)  # (B, C, M, 2N)
        real = other_graph & node_mask.reshape(B, 1, 1, 2 * N)
        same = flat_colours == own_colour
        wanted = torch.where(y.reshape(B, 1, 1, 1).bool(), same, ~same) & real
        candidates = torch.where(wanted.any(-1, keepdim=True), wanted, real)
        logits = torch.zeros(B, C, M, 2 * N, device=message.device).masked_fill(~candidates, -1e9)
        return self.dummy + logits, self.dummy + torch.zeros(B, 3, device=message.device)

"""Graph-isomorphism heads: node selector + decider (policy), value, solo, and random ones."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from nip_core.agents.mlp import make_mlp, one_hot_round


class GraphIsomorphismPolicyHead(nn.Module):
    """Per-node message logits and (verifiers only) decision logits.

    Outputs ``node_selected_logits (B, visible_channels, position, 2 * N)`` and
    ``decision_logits (B, 3)`` (zeros for non-verifiers: uniform, never used).
    """

    def __init__(self, agent_params, *, is_verifier: bool, num_visible_channels: int, message_size: int,
                 max_nodes: int, max_rounds: int, d_representation: int):
        super().__init__()
        p = agent_params
        self.num_visible_channels, self.message_size = num_visible_channels, message_size
        self.max_rounds = max_rounds
        self.include_round = p.include_round_in_decider
        self.node_selector = make_mlp(d_representation, p.d_node_selector, num_visible_channels * message_size,
                                      p.num_node_selector_layers, p.activation_function)
        self.decider = None
        if is_verifier:
            d_in = 2 * d_representation + (max_rounds + 1 if self.include_round else 0)
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


class GraphIsomorphismValueHead(nn.Module):
    """Graph-level MLP (+ one-hot round) giving the agent's value ``(B, 1)``."""

    def __init__(self, agent_params, *, max_rounds: int, d_representation: int):
        super().__init__()
        p = agent_params
        self.max_rounds = max_rounds
        self.include_round = p.include_round_in_value
        d_in = 2 * d_representation + (max_rounds + 1 if self.include_round else 0)
        self.mlp = make_mlp(d_in, p.d_value, 1, p.num_value_layers, p.activation_function)

    def forward(self, graph_repr: Tensor, round_: Tensor) -> Tensor:
        features = graph_repr.reshape(graph_repr.shape[0], -1)
        if self.include_round:
            features = torch.cat([features, one_hot_round(round_, self.max_rounds)], -1)
        return self.mlp(features)


class GraphIsomorphismSoloHead(nn.Module):
    """Graph-level MLP giving 2 logits (not isomorphic / isomorphic): supervised classification."""

    def __init__(self, agent_params, *, d_representation: int):
        super().__init__()
        p = agent_params
        self.mlp = make_mlp(2 * d_representation, p.d_decider, 2, p.num_decider_layers, p.activation_function)

    def forward(self, graph_repr: Tensor) -> Tensor:
        return self.mlp(graph_repr.reshape(graph_repr.shape[0], -1))


class RandomAgentBody(nn.Module):
    """Zero representations; one dummy parameter so optimisers and devices still work."""

    def __init__(self, *, max_nodes: int, d_representation: int):
        super().__init__()
        self.dummy = nn.Parameter(torch.zeros(()))
        self.max_nodes, self.d = max_nodes, d_representation

    def forward(self, x, adjacency, message, node_mask, ignore_message):
        B = x.shape[0]
        zero = self.dummy * 0
        return (zero + torch.zeros(B, 2, self.d, device=x.device),
                zero + torch.zeros(B, 2, self.max_nodes, self.d, device=x.device))


class RandomPolicyHead(nn.Module):
    """All-zero logits: uniform over nodes and decisions."""

    def __init__(self, *, num_visible_channels: int, message_size: int, max_nodes: int):
        super().__init__()
        self.dummy = nn.Parameter(torch.zeros(()))
        self.shape = (num_visible_channels, message_size, 2 * max_nodes)

    def forward(self, graph_repr, node_repr, round_):
        B = graph_repr.shape[0]
        zero = self.dummy * 0
        return (zero + torch.zeros(B, *self.shape, device=graph_repr.device),
                zero + torch.zeros(B, 3, device=graph_repr.device))


class ConstantValueHead(nn.Module):
    """Value 0 for every state."""

    def __init__(self):
        super().__init__()
        self.dummy = nn.Parameter(torch.zeros(()))

    def forward(self, graph_repr, round_):
        return self.dummy * 0 + torch.zeros(graph_repr.shape[0], 1, device=graph_repr.device)

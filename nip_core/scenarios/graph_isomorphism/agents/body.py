"""The graph-isomorphism agent body: dense GIN, pooling, and a cross-graph transformer.

``nip_spec.md`` §2.1.4. The body turns one agent's view of an episode (its visible message
history ``x``, the latest message, the two graphs) into a representation of each graph
``(..., 2, d_repr)`` and of each node ``(..., 2, max_nodes, d_repr)``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from nip_core.agents.mlp import activation_class


class DenseGinLayer(nn.Module):
    """``x'_i = MLP((1 + eps) x_i + sum_j A_ij x_j)`` with ``eps = 0``, masked to real nodes."""

    def __init__(self, d: int, d_mlp: int, activation: str):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(d, d_mlp), activation_class(activation)(), nn.Linear(d_mlp, d))

    def forward(self, h: Tensor, adjacency: Tensor, node_mask: Tensor) -> Tensor:
        # h: (..., N, d); adjacency: (..., N, N) float; node_mask: (..., N) float
        aggregated = h + adjacency @ h
        return self.mlp(aggregated) * node_mask.unsqueeze(-1)


class GraphIsomorphismGnn(nn.Module):
    """``Linear(d_input, d_gnn)`` then ``num_layers`` x [activation, GIN layer]."""

    def __init__(self, d_input: int, d_gnn: int, d_gin_mlp: int, num_layers: int, activation: str,
                 output_digits: int | None = None):
        super().__init__()
        self.input_layer = nn.Linear(d_input, d_gnn)
        self.activation = activation_class(activation)()
        self.layers = nn.ModuleList(DenseGinLayer(d_gnn, d_gin_mlp, activation) for _ in range(num_layers))
        self.output_digits = output_digits

    def forward(self, features: Tensor, adjacency: Tensor, node_mask: Tensor) -> Tensor:
        h = self.input_layer(features) * node_mask.unsqueeze(-1)
        for layer in self.layers:
            h = layer(self.activation(h), adjacency, node_mask)
        if self.output_digits is not None:
            h = torch.round(h, decimals=self.output_digits)
        return h


class GraphIsomorphismAgentBody(nn.Module):
    """One agent's body.

    Parameters
    ----------
    agent_params
        The agent's ``GraphIsomorphismAgentParameters``.
    max_rounds, num_visible_channels, message_size, max_nodes
        Sizes of the agent's input.
    d_representation
        Size of the output representations.
    """

    def __init__(self, agent_params, *, max_rounds: int, num_visible_channels: int, message_size: int,
                 max_nodes: int, d_representation: int):
        super().__init__()
        p = agent_params
        self.max_nodes = max_nodes
        self.use_dual_gnn = p.use_dual_gnn
        self.use_pair_invariant_pooling = p.use_pair_invariant_pooling
        self.noise_sigma = p.noise_sigma
        d_input = max_rounds * num_visible_channels * message_size
        self.gnn = GraphIsomorphismGnn(d_input, p.d_gnn, p.d_gin_mlp, p.num_gnn_layers,
                                       p.activation_function, p.gnn_output_digits)
        d_gnn_out = 2 * p.d_gnn if p.use_dual_gnn else p.d_gnn
        # Batch statistics even in eval (the original's behaviour, QUIRK 19 kept: the pooled
        # sums of a single datapoint have no meaningful running statistics to track).
        self.batch_norm = nn.BatchNorm1d(d_gnn_out, track_running_stats=False) if p.use_batch_norm else None
        d_message = num_visible_channels * message_size
        self.num_transformer_layers = p.num_transformer_layers
        self.num_heads = p.num_heads
        self.token_encoder = nn.Linear(d_gnn_out + 2 + d_message, p.d_transformer)
        if p.num_transformer_layers > 0:
            layer = nn.TransformerEncoderLayer(p.d_transformer, p.num_heads, p.d_transformer_mlp,
                                               dropout=p.transformer_dropout, batch_first=True)
            self.transformer = nn.TransformerEncoder(layer, p.num_transformer_layers,
                                                     enable_nested_tensor=False)
        else:
            self.transformer = None
        self.representation_encoder = nn.Linear(p.d_transformer, d_representation)
        N = max_nodes
        L = 2 + 2 * N
        # Node tokens of one graph may not attend to node tokens of the same graph: they
        # see the other graph's nodes and the two pooled tokens only.
        same_graph = torch.zeros(L, L, dtype=torch.bool)
        same_graph[2:2 + N, 2:2 + N] = True
        same_graph[2 + N:, 2 + N:] = True
        self.register_buffer("same_graph_mask", same_graph, persistent=False)

    def forward(self, x: Tensor, adjacency: Tensor, message: Tensor, node_mask: Tensor,
                ignore_message: Tensor) -> tuple[Tensor, Tensor]:
        """Compute the representations.

        Parameters
        ----------
        x : (B, rounds, channels, position, 2, N)
        adjacency : (B, 2, N, N)
        message : (B, channels, position, 2, N)
        node_mask : (B, 2, N) bool
        ignore_message : (B,) bool

        Returns
        -------
        graph_level_repr : (B, 2, d_repr)
        node_level_repr : (B, 2, N, d_repr)
        """
        B, N = x.shape[0], self.max_nodes
        features = x.reshape(B, -1, 2, N).permute(0, 2, 3, 1)  # (B, 2, N, d_input)
        adj = adjacency.float()
        mask_f = node_mask.float()
        h = self.gnn(features, adj, mask_f)
        if self.use_dual_gnn:
            h = torch.cat([h, self.gnn(torch.zeros_like(features), adj, mask_f)], dim=-1)
        pooled = h.sum(-2)  # (B, 2, d)
        if self.batch_norm is not None:
            pooled = self.batch_norm(pooled.reshape(B * 2, -1)).reshape(B, 2, -1)
        if self.training and self.noise_sigma > 0:
            pooled = pooled * (1 + self.noise_sigma * torch.randn_like(pooled[:, :1]))
        if self.use_pair_invariant_pooling:
            pooled = torch.stack([pooled.mean(1), 0.5 * (pooled[:, 0] - pooled[:, 1]).abs()], dim=1)
        d_message = message.shape[1] * message.shape[2]
        msg = message.reshape(B, d_message, 2 * N).transpose(1, 2)  # (B, 2N, d_message)
        msg = msg * (~ignore_message).float()[:, None, None]
        flags = torch.eye(2, device=x.device).expand(B, 2, 2)
        pooled_tokens = torch.cat([pooled, flags, torch.zeros(B, 2, d_message, device=x.device)], -1)
        node_tokens = torch.cat([h.reshape(B, 2 * N, -1), torch.zeros(B, 2 * N, 2, device=x.device), msg], -1)
        tokens = self.token_encoder(torch.cat([pooled_tokens, node_tokens], dim=1))  # (B, L, d_t)
        if self.transformer is not None:
            key_absent = torch.cat([torch.zeros(B, 2, dtype=torch.bool, device=x.device),
                                    ~node_mask.reshape(B, 2 * N)], dim=1)
            blocked = self.same_graph_mask.unsqueeze(0) | key_absent.unsqueeze(1)  # (B, L, L)
            attn_mask = torch.zeros(blocked.shape, device=x.device).masked_fill(blocked, float("-inf"))
            attn_mask = attn_mask.repeat_interleave(self.num_heads, dim=0)
            tokens = self.transformer(tokens, mask=attn_mask)
        reprs = self.representation_encoder(tokens)
        return reprs[:, :2], reprs[:, 2:].reshape(B, 2, N, -1)

"""The graph-isomorphism agent body: dense GIN, pooling, and a cross-graph transformer.

docs/behaviour.md#b18. The body turns one agent's view of an episode (its visible message
history ``x``, the latest message, the two graphs) into a representation of each graph
``(..., 2, d_repr)`` and of each node ``(..., 2, max_nodes, d_repr)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nip_core.agents.base import AgentBody, TensorDictAgentPartMixin
from nip_core.agents.mlp import FastTanh, activation_class, two_layer_mlp
from nip_core.scenarios.graph_isomorphism.agents.aggregation import gin_aggregate
from nip_core.scenarios.graph_isomorphism.agents.attention import (
    autocast_enabled,
    native_projected_attention_applies,
    projected_self_attention,
    self_attention,
)
from nip_core.scenarios.graph_isomorphism.agents.fused_mlp import folded_tanh_mlp, stacked_two_layer_mlp
from nip_core.scenarios.graph_isomorphism.agents.layer_norm import layer_norm


def compute_dtype(reference: Tensor, parameter: Tensor) -> torch.dtype:
    """The dtype activations have: autocast's lower-precision dtype when it is on, else the weights'."""
    if autocast_enabled(reference):
        return torch.get_autocast_dtype(reference.device.type)
    return parameter.dtype


class DenseGinLayer(nn.Module):
    """``x'_i = MLP((1 + eps) x_i + sum_j A_ij x_j)`` with ``eps = 0`` and ``x = act(m ⊙ z)``.

    ``z`` is the previous layer's output before masking; the result is not masked either (the
    next layer's aggregation, or the GNN at the end, applies the node mask).
    """

    def __init__(self, d: int, d_mlp: int, activation: str):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(d, d_mlp), activation_class(activation)(), nn.Linear(d_mlp, d))

    def forward(self, z: Tensor, self_adjacency: Tensor, node_mask: Tensor, activation: nn.Module) -> Tensor:
        # z: (..., N, d); self_adjacency: (..., N, N) float, A + I; node_mask: (..., N) float
        *lead, N, d = z.shape
        x = gin_aggregate(z.reshape(-1, N, d), self_adjacency.reshape(-1, N, N), node_mask.reshape(-1, N),
                          activation)
        first, mlp_activation, second = self.mlp
        if isinstance(mlp_activation, FastTanh):  # as the stacked bodies compute it (agents/stacked.py)
            out = folded_tanh_mlp(x.reshape(1, -1, d), first.weight.t().unsqueeze(0),
                                  None if first.bias is None else first.bias.unsqueeze(0),
                                  second.weight.t().unsqueeze(0), None if second.bias is None else second.bias.unsqueeze(0))
            return out.view(*lead, N, -1)
        return two_layer_mlp(x, first, mlp_activation, second).view(*lead, N, -1)


class GraphIsomorphismGnn(nn.Module):
    """``Linear(d_input, d_gnn)`` then ``num_layers`` x [activation, GIN layer]."""

    def __init__(self, d_input: int, d_gnn: int, d_gin_mlp: int, num_layers: int, activation: str,
                 output_digits: int | None = None):
        super().__init__()
        self.input_layer = nn.Linear(d_input, d_gnn)
        self.activation = activation_class(activation)()
        self.layers = nn.ModuleList(DenseGinLayer(d_gnn, d_gin_mlp, activation) for _ in range(num_layers))
        self.output_digits = output_digits

    def forward(self, features: Tensor | None, adjacency: Tensor, node_mask: Tensor, dual: bool = False) -> Tensor:
        """Node features ``(B, 2, N, d_gnn)``, or ``(B, 2, N, 2 d_gnn)`` with ``dual``.

        ``features`` is ``(B, 2, N, d_input)``, or ``None`` for all-zero features. With
        ``dual`` the network also runs on all-zero features (the second half of the
        output); both passes go through the layers as one batch of ``2B`` graph pairs.
        """
        if features is None:
            z = self.input_layer.bias.to(node_mask.dtype).expand(*node_mask.shape, self.input_layer.out_features)
        else:
            z = self.input_layer(features).to(node_mask.dtype)
            if dual:
                z = torch.cat([z, self.input_layer.bias.to(z.dtype).expand(z.shape)], dim=0)
                node_mask = torch.cat([node_mask, node_mask], dim=0)
                adjacency = torch.cat([adjacency, adjacency], dim=0)
        # GIN aggregation (1 + eps) x_i + sum_j A_ij x_j with eps = 0, as one product
        self_adjacency = adjacency + torch.eye(adjacency.shape[-1], device=adjacency.device,
                                               dtype=adjacency.dtype)
        for layer in self.layers:
            z = layer(z, self_adjacency, node_mask, self.activation)
        # the mask at full size: on CPUs a broadcasting bf16 multiply is ~10x slower than an elementwise one
        h = z * node_mask.unsqueeze(-1).expand(z.shape).contiguous()
        if self.output_digits is not None:
            h = torch.round(h, decimals=self.output_digits)
        if features is not None and dual:
            half = h.shape[0] // 2
            h = torch.cat([h[:half], h[half:]], dim=-1)
        return h


class GraphIsomorphismAgentBody(TensorDictAgentPartMixin, AgentBody):
    """One agent's body: GNN over both graphs, pooling, cross-graph transformer.

    Parameters
    ----------
    hyper_params, settings, agent_name, protocol_handler
        As :class:`~nip_core.agents.base.AgentPart`; the architecture comes from the
        agent's ``GraphIsomorphismAgentParameters``, the input sizes from the protocol
        (rounds, the agent's visible channels) and ``hyper_params.message_size``.
    max_nodes
        Number of node slots per graph.
    """

    in_keys = ("x", "adjacency", "message", "node_mask", "ignore_message")
    out_keys = ("graph_level_repr", "node_level_repr")

    def __init__(self, hyper_params, settings, agent_name: str, protocol_handler, *, max_nodes: int):
        super().__init__(hyper_params, settings, agent_name, protocol_handler)
        p = self.agent_params
        max_rounds = protocol_handler.max_message_rounds
        num_visible_channels = len(self.visible_channel_indices)
        message_size = hyper_params.message_size
        d_representation = self.d_representation
        self.max_nodes = max_nodes
        self.use_dual_gnn = p.use_dual_gnn
        self.use_pair_invariant_pooling = p.use_pair_invariant_pooling
        self.noise_sigma = p.noise_sigma
        d_input = max_rounds * num_visible_channels * message_size
        self.gnn = GraphIsomorphismGnn(d_input, p.d_gnn, p.d_gin_mlp, p.num_gnn_layers,
                                       p.activation_function, p.gnn_output_digits)
        d_gnn_out = 2 * p.d_gnn if p.use_dual_gnn else p.d_gnn
        # Batch statistics even in eval (the original's behaviour, kept, docs/behaviour.md#b18: the pooled
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
        self._token_slices = (d_gnn_out, d_gnn_out + 2)  # [repr | flags | message] input columns

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
        dtype = compute_dtype(x, self.gnn.input_layer.weight)  # bf16 under bf16 autocast
        adj = adjacency.to(dtype)
        mask_f = node_mask.to(dtype)
        h = self.gnn(features, adj, mask_f, dual=self.use_dual_gnn)
        pooled = h.sum(-2)  # (B, 2, d)
        if self.batch_norm is not None:
            pooled = self.batch_norm(pooled.reshape(B * 2, -1)).reshape(B, 2, -1)
        if self.training and self.noise_sigma > 0:
            pooled = pooled * (1 + self.noise_sigma * torch.randn_like(pooled[:, :1]))
        if self.use_pair_invariant_pooling:
            pooled = torch.stack([pooled.mean(1), 0.5 * (pooled[:, 0] - pooled[:, 1]).abs()], dim=1)
        d_message = message.shape[1] * message.shape[2]
        msg = message.reshape(B, d_message, 2 * N).transpose(1, 2)  # (B, 2N, d_message)
        msg = msg * (~ignore_message).to(msg.dtype)[:, None, None]
        tokens = self._encode_tokens(pooled, h.reshape(B, 2 * N, -1), msg)  # (B, L, d_t)
        if self.transformer is not None:
            # Additive attention mask (B, 1, L, L): node tokens do not see the nodes of their
            # own graph, and nobody sees absent nodes.
            attn_mask = attention_mask(self.same_graph_mask, node_mask, tokens.dtype)
            for layer in self.transformer.layers:
                tokens = encoder_layer_forward(layer, tokens, attn_mask)
            if self.transformer.norm is not None:
                tokens = layer_norm(self.transformer.norm, tokens)
        reprs = self.representation_encoder(tokens)
        return reprs[:, :2], reprs[:, 2:].reshape(B, 2, N, -1)

    def _encode_tokens(self, pooled: Tensor, node_h: Tensor, msg: Tensor) -> Tensor:
        """``token_encoder`` of the tokens ``[pooled | flag | 0]`` and ``[node | 0 | message]``.

        The encoder is linear, so its weight is applied block by block instead of to
        concatenations that are mostly zeros.
        """
        weight, bias = self.token_encoder.weight, self.token_encoder.bias
        a, b = self._token_slices
        w_repr, w_flag, w_msg = weight[:, :a], weight[:, a:b], weight[:, b:]
        # pooled token i carries the one-hot flag i: its contribution is column i of w_flag
        pooled_tokens = torch.nn.functional.linear(pooled, w_repr) + (w_flag.t() + bias)
        node_tokens = torch.addmm(bias, node_h.reshape(-1, a), w_repr.t()).reshape(*node_h.shape[:2], -1)
        node_tokens = node_tokens + msg @ w_msg.t()
        return torch.cat([pooled_tokens.to(node_tokens.dtype), node_tokens], dim=1)


def attention_mask(same_graph: Tensor, node_mask: Tensor, dtype: torch.dtype) -> Tensor:
    """The additive attention mask ``(B, 1, L, L)`` of the tokens ``[2 pooled | 2N nodes]``: ``-inf``
    where ``same_graph (L, L)`` is true (a node token and a node of its own graph) or the key is an
    absent node (``node_mask (B, 2, N)`` false), else 0.

    Built as the sum of the two broadcast terms: one pass over the ``(B, L, L)`` result (a boolean
    or of the broadcasts and a masked fill, as written before, took ten times longer on a CPU).
    """
    B, L = node_mask.shape[0], same_graph.shape[-1]
    blocked_pairs = torch.zeros(L, L, dtype=dtype, device=node_mask.device).masked_fill_(same_graph, float("-inf"))
    absent_keys = torch.zeros(B, 1, L, dtype=dtype, device=node_mask.device)
    absent_keys[:, :, 2:].masked_fill_(~node_mask.reshape(B, 1, L - 2), float("-inf"))
    return (blocked_pairs + absent_keys).unsqueeze(1)


def encoder_layer_forward(layer: nn.TransformerEncoderLayer, x: Tensor, attn_mask: Tensor) -> Tensor:
    """``layer(x, src_mask)`` written out for short sequences (batch first).

    Equivalent to :class:`torch.nn.TransformerEncoderLayer`'s forward (post- or pre-norm,
    dropout where it has it), with explicit attention products instead of a fused
    scaled-dot-product kernel: for sequences of ~24 tokens and head size 4 the fused CPU
    kernels cost several times the arithmetic. ``attn_mask`` is additive, broadcast to
    ``(B, heads, L, L)``.
    """
    attention = layer.self_attn
    B, L, d = x.shape
    H = attention.num_heads
    p_drop = layer.dropout.p if layer.training else 0.0
    p_attention = attention.dropout if layer.training else 0.0

    def attention_block(src: Tensor) -> Tensor:
        weight, bias = attention.in_proj_weight, attention.in_proj_bias
        if bias is not None and native_projected_attention_applies(src, weight[None], attn_mask, p_attention):
            # as the stacked bodies run it (agents/stacked.py)
            attended = projected_self_attention(src, weight[None], bias[None], attn_mask, H, p_attention)
        else:
            qkv = torch.nn.functional.linear(src, attention.in_proj_weight, attention.in_proj_bias)
            attended = self_attention(qkv, attn_mask, H, p_attention)
        out = attention.out_proj(attended)  # (B, L, d)
        return torch.nn.functional.dropout(out, p_drop) if p_drop > 0 else out

    def feed_forward(src: Tensor) -> Tensor:
        first, second = layer.linear1, layer.linear2
        if p_drop == 0 and layer.activation is F.relu and first.bias is not None and second.bias is not None:
            # as the stacked bodies compute it (agents/stacked.py)
            out = stacked_two_layer_mlp(src.reshape(1, B * L, d), first.weight.t().unsqueeze(0), first.bias.unsqueeze(0),
                                        "relu", second.weight.t().unsqueeze(0), second.bias.unsqueeze(0))
            return out.view(B, L, -1)
        hidden = layer.activation(layer.linear1(src))
        if p_drop > 0:
            hidden = torch.nn.functional.dropout(hidden, p_drop)
        out = layer.linear2(hidden)
        return torch.nn.functional.dropout(out, p_drop) if p_drop > 0 else out

    # the layer norms as the stacked bodies compute them (agents/stacked.py)
    if layer.norm_first:
        x = x + attention_block(layer_norm(layer.norm1, x))
        return x + feed_forward(layer_norm(layer.norm2, x))
    x = layer_norm(layer.norm1, x + attention_block(x))
    return layer_norm(layer.norm2, x + feed_forward(x))

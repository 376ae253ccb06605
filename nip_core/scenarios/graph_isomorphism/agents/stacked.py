"""Several agent bodies of equal shape run as one batched computation.

With ``rl.use_shared_body = False`` every agent has a policy body and a value body of the
same shapes that see the same input. :func:`stacked_bodies_forward` runs such bodies
together: their weights are stacked (``torch.stack``, on the fly, so every body keeps
owning its parameters and the checkpoint keys stay as they are) and every layer becomes
one batched product (``bmm``/``baddbmm``) over a leading body dimension ``K``, every
activation one elementwise op over all bodies. The result equals running each body on its
own up to float rounding (batched products may sum in another order).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nip_core.agents.mlp import FastTanh
from nip_core.scenarios.graph_isomorphism.agents.aggregation import gin_aggregate
from nip_core.scenarios.graph_isomorphism.agents.attention import projected_self_attention
from nip_core.scenarios.graph_isomorphism.agents.body import GraphIsomorphismAgentBody, attention_mask, compute_dtype
from nip_core.scenarios.graph_isomorphism.agents.fused_mlp import folded_tanh_mlp, stacked_two_layer_mlp
from nip_core.scenarios.graph_isomorphism.agents.layer_norm import stacked_layer_norm


# The parameter names and shapes of each body that has been asked about, remembered: walking a GI body's
# modules for them took ~0.1 ms, and :func:`can_stack` runs twice a minibatch step. A body's parameters
# keep their shapes once it is built (nipflow never replaces them); one replaced afterwards by a tensor
# of another shape makes the stacked forward pass's ``torch.stack`` fail, naming the shapes.
_parameter_shapes: weakref.WeakKeyDictionary[nn.Module, tuple] = weakref.WeakKeyDictionary()


def _structure(body: nn.Module) -> tuple:
    """What must agree between bodies for them to run stacked: settings and parameter shapes."""
    if type(body) is not GraphIsomorphismAgentBody:
        return (type(body),)
    layers = body.transformer.layers if body.transformer is not None else []
    settings = (body.use_dual_gnn, body.use_pair_invariant_pooling, body.noise_sigma, body.num_heads,
                body.gnn.output_digits, type(body.gnn.activation), body.batch_norm is None,
                body.batch_norm.eps if body.batch_norm is not None else None,
                body.transformer is not None and body.transformer.norm is None,
                tuple((layer.norm_first, layer.activation, layer.dropout.p, layer.self_attn.dropout,
                       layer.norm1.eps, layer.norm2.eps) for layer in layers))
    shapes = _parameter_shapes.get(body)
    if shapes is None:
        shapes = _parameter_shapes[body] = tuple((name, tuple(p.shape)) for name, p in body.named_parameters())
    return settings + shapes


def can_stack(bodies: Sequence[nn.Module]) -> bool:
    """Whether :func:`stacked_bodies_forward` can run ``bodies`` (GI bodies of one structure)."""
    if len(bodies) < 2 or type(bodies[0]) is not GraphIsomorphismAgentBody:
        return False
    first = _structure(bodies[0])
    return all(_structure(body) == first for body in bodies[1:])


def _weights(linears: Sequence[nn.Linear]) -> tuple[Tensor, Tensor | None]:
    """``(K, d_in, d_out)`` transposed weights and ``(K, 1, d_out)`` biases of ``linears``."""
    weight = torch.stack([linear.weight for linear in linears]).transpose(1, 2)
    if linears[0].bias is None:
        return weight, None
    return weight, torch.stack([linear.bias for linear in linears]).unsqueeze(1)


def _linear(x: Tensor, linears: Sequence[nn.Linear]) -> Tensor:
    """Body ``k``'s ``linears[k]`` applied to ``x[k]``; ``x`` is ``(K, ..., d_in)``."""
    weight, bias = _weights(linears)
    flat = x.reshape(x.shape[0], -1, x.shape[-1])
    out = torch.bmm(flat, weight) if bias is None else torch.baddbmm(bias, flat, weight)
    return out.view(*x.shape[:-1], weight.shape[-1])


def _mlp(x: Tensor, mlps: Sequence[nn.Sequential], rows: Tensor | None) -> Tensor:
    """Body ``k``'s two-layer ``mlps[k]`` (linear, activation, linear) applied to ``x[k]``; with
    ``rows``, at those rows of ``x.reshape(K, -1, d_in)`` (:func:`stacked_two_layer_mlp`'s), 0 at the others.

    With tanh, the activation is folded into the linear layers as in
    :func:`~nip_core.agents.mlp.two_layer_mlp` (the hidden tensor written once).
    """
    firsts, seconds, activation = [mlp[0] for mlp in mlps], [mlp[2] for mlp in mlps], mlps[0][1]
    flat = x.reshape(x.shape[0], -1, x.shape[-1])
    if not isinstance(activation, FastTanh):
        out = _linear(activation(_linear(flat if rows is None else flat.index_select(1, rows), firsts)), seconds)
        if rows is not None:
            out = out.new_zeros(*flat.shape[:2], out.shape[-1]).index_copy(1, rows, out)
    else:
        (w1, b1), (w2, b2) = _weights(firsts), _weights(seconds)
        out = folded_tanh_mlp(flat, w1, None if b1 is None else b1.squeeze(1), w2,
                              None if b2 is None else b2.squeeze(1), rows)
    return out.view(*x.shape[:-1], out.shape[-1])


def _shared_linear(x: Tensor, linears: Sequence[nn.Linear]) -> Tensor:
    """Every body's linear layer applied to the same input ``x (..., d_in)``: ``(K, ..., d_out)``."""
    weight, bias = _weights(linears)
    out = torch.matmul(x.reshape(1, -1, x.shape[-1]), weight)
    if bias is not None:
        out = out + bias
    return out.view(len(linears), *x.shape[:-1], weight.shape[-1])


def _layer_norm(x: Tensor, norms: Sequence[nn.LayerNorm]) -> Tensor:
    """Per-body layer norm of ``x (K, M, d)`` (:func:`stacked_layer_norm`)."""
    if norms[0].weight is None:
        return stacked_layer_norm(x, None, None, norms[0].eps)
    weight = torch.stack([n.weight for n in norms])
    bias = None if norms[0].bias is None else torch.stack([n.bias for n in norms])
    return stacked_layer_norm(x, weight, bias, norms[0].eps)


def _gnn(bodies: Sequence[GraphIsomorphismAgentBody], features: Tensor, adjacency: Tensor,
         mask: Tensor) -> Tensor:
    """The bodies' GNNs (dual or not) on shared inputs: ``(K, B, 2, N, d)`` node features."""
    gnns = [body.gnn for body in bodies]
    K = len(gnns)
    inputs = [gnn.input_layer for gnn in gnns]
    z = _shared_linear(features, inputs).to(mask.dtype)  # (K, B, 2, N, d), before masking
    if bodies[0].use_dual_gnn:
        zero_input = torch.stack([layer.bias for layer in inputs]).to(mask.dtype).view(K, 1, 1, 1, -1)
        z = torch.cat([z, zero_input.expand(z.shape)], dim=1)
        mask = torch.cat([mask, mask], dim=0)
        adjacency = torch.cat([adjacency, adjacency], dim=0)
    B2, N = adjacency.shape[0], adjacency.shape[-1]
    self_adjacency = adjacency + torch.eye(N, device=adjacency.device, dtype=adjacency.dtype)
    # every body's copy of graph b has adjacency and mask b
    self_adjacency, node_mask = self_adjacency.reshape(-1, N, N), mask.reshape(-1, N)
    activation = gnns[0].activation
    # On a CPU the GIN layers' MLPs compute the real nodes' rows only: the padding nodes' are 0,
    # which is what the next aggregation and the GNN's output make of them anyway (both apply
    # the mask). Elsewhere every row, then the mask: a list of the rows would be data-dependent
    # (a GPU waits for it; the meta device cannot make one).
    rows = node_mask.reshape(-1).nonzero().squeeze(1) if z.device.type == "cpu" else None
    for depth in range(len(gnns[0].layers)):
        x = gin_aggregate(z.reshape(-1, N, z.shape[-1]), self_adjacency, node_mask, activation)
        z = _mlp(x.view(K, B2, 2, N, -1), [gnn.layers[depth].mlp for gnn in gnns], rows)
    # else the mask at full size (on CPUs a broadcasting bf16 multiply is ~10x slower than an
    # elementwise one)
    h = z if rows is not None and gnns[0].layers else z * mask.unsqueeze(-1).expand(z.shape).contiguous()
    if gnns[0].output_digits is not None:
        h = torch.round(h, decimals=gnns[0].output_digits)
    if bodies[0].use_dual_gnn:
        half = B2 // 2
        h = torch.cat([h[:, :half], h[:, half:]], dim=-1)
    return h


def _groups(graph_only: Sequence[bool]) -> list[tuple[slice | Tensor, bool]]:
    """The bodies as runs of equal ``graph_only``: ``(index along K, graph_only)`` each, in order
    (a slice for a run of consecutive bodies, else an index tensor)."""
    kinds = sorted(set(graph_only))
    out = []
    for kind in kinds:
        members = [k for k, flag in enumerate(graph_only) if flag == kind]
        run = members == list(range(members[0], members[-1] + 1))
        out.append((slice(members[0], members[-1] + 1) if run else torch.tensor(members), kind))
    return out


def _take(t: Tensor, index: slice | Tensor) -> Tensor:
    """The bodies ``index`` (of :func:`_groups`) of ``t (K, ...)``."""
    return t[index] if isinstance(index, slice) else t.index_select(0, index.to(t.device))


def _parts(t: Tensor, groups: Sequence[tuple[slice | Tensor, bool]]) -> list[Tensor]:
    """``[_take(t, index) for index, _ in groups]``. Where the groups are runs that together cover
    ``t``'s bodies, ``t`` itself (one group) or one split of it: slicing each part out would zero-fill
    a gradient of the whole of ``t`` per part in the backward pass and add them, a split writes it once."""
    spans = sorted((index.start, index.stop, at) for at, (index, _) in enumerate(groups) if isinstance(index, slice))
    if len(spans) != len(groups) or [start for start, _, _ in spans] != [0] + [stop for _, stop, _ in spans[:-1]] \
            or spans[-1][1] != t.shape[0]:
        return [_take(t, index) for index, _ in groups]
    if len(spans) == 1:
        return [t]
    out: list[Tensor] = [t] * len(groups)
    for (_, _, at), part in zip(spans, t.split([stop - start for start, stop, _ in spans])):
        out[at] = part
    return out


def _members(index: slice | Tensor, K: int) -> list[int]:
    """The body numbers of a group index of :func:`_groups`."""
    return list(range(K)[index]) if isinstance(index, slice) else index.tolist()


def _encoder_layer(layers: Sequence[nn.TransformerEncoderLayer], x: Tensor, attn_mask: Tensor,
                   graph_only: Sequence[bool] | None = None) -> list[tuple[slice | Tensor, Tensor]]:
    """:func:`~nip_core.scenarios.graph_isomorphism.agents.body.encoder_layer_forward` of
    every body at once; ``x`` is ``(K, B, L, d)``, ``attn_mask`` ``(B, 1, L, L)`` additive.

    Returns ``(index along K, tokens (K', B, L', d))`` per group of bodies (:func:`_groups`; one
    group of all bodies without ``graph_only``): the bodies of ``graph_only`` are computed at their
    two graph tokens only (``L' = 2``; every token stays a key and a value of the attention), the
    others at every token.
    """
    first = layers[0]
    B, L, d = x.shape[1:]
    H = first.self_attn.num_heads
    p_drop = first.dropout.p if first.training else 0.0
    p_attention = first.self_attn.dropout if first.training else 0.0

    def dropout(t: Tensor, p: float) -> Tensor:
        return F.dropout(t, p) if p > 0 else t

    def attention_block(group: Sequence[nn.TransformerEncoderLayer], src: Tensor, rows: int) -> Tensor:
        heads = [layer.self_attn for layer in group]
        weight = torch.stack([a.in_proj_weight for a in heads])  # (K', 3 d, d)
        bias = torch.stack([a.in_proj_bias for a in heads])
        out = projected_self_attention(src.view(len(group) * B, L, d), weight, bias, attn_mask, H, p_attention,
                                       None if rows == L else rows).reshape(len(group), B * rows, d)
        return dropout(_linear(out, [a.out_proj for a in heads]), p_drop)

    def feed_forward(group: Sequence[nn.TransformerEncoderLayer], src: Tensor) -> Tensor:
        firsts, seconds = [layer.linear1 for layer in group], [layer.linear2 for layer in group]
        if p_drop == 0 and first.activation is F.relu and firsts[0].bias is not None and seconds[0].bias is not None:
            (w1, b1), (w2, b2) = _weights(firsts), _weights(seconds)
            return stacked_two_layer_mlp(src, w1, b1.squeeze(1), "relu", w2, b2.squeeze(1))
        hidden = dropout(first.activation(_linear(src, firsts)), p_drop)
        return dropout(_linear(hidden, seconds), p_drop)

    out = []
    groups = _groups(graph_only if graph_only is not None else [False] * x.shape[0])
    for (index, narrow), part in zip(groups, _parts(x, groups)):
        group = [layers[k] for k in _members(index, x.shape[0])]
        K, rows = len(group), 2 if narrow else L
        xg = part.reshape(K, B * L, d)
        norm1, norm2 = [layer.norm1 for layer in group], [layer.norm2 for layer in group]

        def kept(t: Tensor) -> Tensor:  # the rows computed past the attention
            return t if rows == L else t.view(K, B, L, d)[:, :, :rows].reshape(K, B * rows, d)

        if first.norm_first:
            xg = kept(xg) + attention_block(group, _layer_norm(xg, norm1), rows)
            xg = xg + feed_forward(group, _layer_norm(xg, norm2))
        else:
            xg = _layer_norm(kept(xg) + attention_block(group, xg, rows), norm1)
            xg = _layer_norm(xg + feed_forward(group, xg), norm2)
        out.append((index, xg.view(K, B, rows, d)))
    return out


def stacked_bodies_forward(bodies: Sequence[GraphIsomorphismAgentBody], x: Tensor, adjacency: Tensor,
                           message: Tensor, node_mask: Tensor, ignore_message: Tensor,
                           graph_only: Sequence[bool] | None = None) -> list[tuple[Tensor, Tensor | None]]:
    """``[body(x, adjacency, message, node_mask, ignore_message) for body in bodies]`` in one pass.

    Parameters
    ----------
    bodies
        Bodies for which :func:`can_stack` holds.
    x, adjacency, message, node_mask, ignore_message
        As :meth:`GraphIsomorphismAgentBody.forward`, shared by all bodies.
    graph_only
        Per body, whether only its graph-level representation is wanted (a value body whose head
        reads no node-level one): its last transformer layer, after the attention, and its
        representation encoder then run at the two graph tokens only, and its
        ``node_level_repr`` is None. The graph-level result is that of the whole body.

    Returns
    -------
    list of (graph_level_repr (B, 2, d_repr), node_level_repr (B, 2, N, d_repr) or None)
        One pair per body, in the order of ``bodies``.
    """
    first = bodies[0]
    K, B, N = len(bodies), x.shape[0], first.max_nodes
    features = x.reshape(B, -1, 2, N).permute(0, 2, 3, 1)  # (B, 2, N, d_input)
    dtype = compute_dtype(x, first.gnn.input_layer.weight)
    mask_f = node_mask.to(dtype)
    h = _gnn(bodies, features, adjacency.to(dtype), mask_f)  # (K, B, 2, N, d)
    pooled = h.sum(-2)  # (K, B, 2, d)
    d_pool = pooled.shape[-1]
    if first.batch_norm is not None:
        # batch statistics per channel: the bodies' channels side by side in one batch norm
        norms = [body.batch_norm for body in bodies]
        flat = pooled.permute(1, 2, 0, 3).reshape(B * 2, K * d_pool)
        flat = F.batch_norm(flat, None, None, torch.cat([n.weight for n in norms]),
                            torch.cat([n.bias for n in norms]), True, 0.0, norms[0].eps)
        pooled = flat.view(B, 2, K, d_pool).permute(2, 0, 1, 3)
    if first.training and first.noise_sigma > 0:
        pooled = pooled * (1 + first.noise_sigma * torch.randn_like(pooled[:, :, :1]))
    if first.use_pair_invariant_pooling:
        pooled = torch.stack([pooled.mean(2), 0.5 * (pooled[:, :, 0] - pooled[:, :, 1]).abs()], dim=2)
    d_message = message.shape[1] * message.shape[2]
    msg = message.reshape(B, d_message, 2 * N).transpose(1, 2)  # (B, 2N, d_message)
    msg = msg * (~ignore_message).to(msg.dtype)[:, None, None]
    tokens = _encode_tokens(bodies, pooled, h.reshape(K, B, 2 * N, -1), msg)  # (K, B, L, d_t)
    flags = list(graph_only) if graph_only is not None else [False] * K
    if first.transformer is not None:
        attn_mask = attention_mask(first.same_graph_mask, node_mask, tokens.dtype)
        depths = len(first.transformer.layers)
        for depth in range(depths):  # every token is a key of the next layer: narrowed in the last only
            layers = [body.transformer.layers[depth] for body in bodies]
            groups = _encoder_layer(layers, tokens, attn_mask, flags if depth == depths - 1 else None)
            tokens = groups[0][1] if depth < depths - 1 else tokens
    else:
        groups = [(index, part[:, :, :2] if narrow else part)
                  for (index, narrow), part in zip(_groups(flags), _parts(tokens, _groups(flags)))]
    outputs: list[tuple[Tensor, Tensor | None]] = [None] * K  # type: ignore[list-item]
    for index, group_tokens in groups:
        members = _members(index, K)
        group = [bodies[k] for k in members]
        if first.transformer is not None and first.transformer.norm is not None:
            group_tokens = _layer_norm(group_tokens.reshape(len(group), -1, group_tokens.shape[-1]),
                                       [body.transformer.norm for body in group]).view(group_tokens.shape)
        reprs = _linear(group_tokens, [body.representation_encoder for body in group])  # (K', B, L', d_repr)
        # graph-level and node-level parts by one split and unbind (views whose backward passes write
        # the gradient once, where indexing zero-fills one per part)
        graph_level, node_level = (reprs, None) if reprs.shape[2] == 2 else reprs.split([2, reprs.shape[2] - 2], dim=2)
        graph_levels = graph_level.unbind(0)
        node_levels = node_level.unbind(0) if node_level is not None else [None] * len(members)
        for k, graph_repr, node_repr in zip(members, graph_levels, node_levels):
            outputs[k] = (graph_repr, None if flags[k] else node_repr.reshape(B, 2, N, -1))
    return outputs


def _encode_tokens(bodies: Sequence[GraphIsomorphismAgentBody], pooled: Tensor, node_h: Tensor,
                   msg: Tensor) -> Tensor:
    """``GraphIsomorphismAgentBody._encode_tokens`` of every body: ``(K, B, 2 + 2N, d_t)``.

    ``pooled`` is ``(K, B, 2, d)``, ``node_h`` ``(K, B, 2N, d)``, ``msg`` ``(B, 2N, d_message)``.
    """
    a, b = bodies[0]._token_slices
    weight = torch.stack([body.token_encoder.weight for body in bodies])  # (K, d_t, d_in)
    bias = torch.stack([body.token_encoder.bias for body in bodies]).unsqueeze(1)  # (K, 1, d_t)
    w_repr, w_flag, w_msg = weight[..., :a].transpose(1, 2), weight[..., a:b], weight[..., b:].transpose(1, 2)
    K, B = pooled.shape[:2]
    # pooled token i carries the one-hot flag i: its contribution is column i of w_flag
    pooled_tokens = torch.bmm(pooled.reshape(K, B * 2, a), w_repr).view(K, B, 2, -1)
    pooled_tokens = pooled_tokens + (w_flag.transpose(1, 2) + bias).unsqueeze(1)
    node_tokens = torch.baddbmm(bias, node_h.reshape(K, -1, a), w_repr)
    node_tokens = node_tokens + torch.matmul(msg.reshape(1, -1, msg.shape[-1]), w_msg)
    node_tokens = node_tokens.view(K, B, -1, node_tokens.shape[-1])
    return torch.cat([pooled_tokens.to(node_tokens.dtype), node_tokens], dim=2)

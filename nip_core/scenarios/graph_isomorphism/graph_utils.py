"""Conversions between the sparse on-disk graph format and dense adjacency matrices.

The raw graph-isomorphism files store a batch of ``N`` graphs as one ``(2, E)`` edge
index whose node indices are *local* to each graph (every graph numbers its nodes from
0), together with ``slices``: the ``(N + 1,)`` cumulative edge counts, so that the edges
of graph ``i`` are the columns ``slices[i]:slices[i + 1]``. Each undirected edge appears
in both directions.

These two helpers replace the ``torch_geometric`` utilities the original library used,
so that the project does not depend on ``torch_geometric``.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["to_dense_adj", "dense_to_sparse"]


def to_dense_adj(
    edge_index: Tensor,
    slices: Tensor,
    sizes: Tensor,
    max_nodes: int,
) -> Tensor:
    """Build dense adjacency matrices from a batch of graphs in the on-disk format.

    Parameters
    ----------
    edge_index : Tensor
        Integer tensor of shape ``(2, E)`` with per-graph local node indices.
    slices : Tensor
        Integer tensor of shape ``(N + 1,)``: cumulative edge counts, ``slices[0] == 0``
        and ``slices[-1] == E``.
    sizes : Tensor
        Integer tensor of shape ``(N,)``: the number of nodes of each graph. Every local
        node index must be below its graph's size.
    max_nodes : int
        The side of the returned matrices; must be at least ``sizes.max()``.

    Returns
    -------
    adjacency : Tensor
        ``int32`` tensor of shape ``(N, max_nodes, max_nodes)``; entry ``[g, i, j]`` is 1
        when graph ``g`` has the (directed) edge ``i -> j``. Repeated edges give 1, not a
        count. Rows and columns at or beyond a graph's size are zero.

    Raises
    ------
    ValueError
        If the shapes are inconsistent or a node index is out of range for its graph.
    """
    if edge_index.ndim != 2 or edge_index.shape[0] != 2:
        raise ValueError(f"edge_index must have shape (2, E), got {tuple(edge_index.shape)}")
    if slices.ndim != 1 or sizes.ndim != 1 or slices.shape[0] != sizes.shape[0] + 1:
        raise ValueError(
            f"slices must have shape (N + 1,) and sizes (N,), got {tuple(slices.shape)} "
            f"and {tuple(sizes.shape)}"
        )
    num_graphs = sizes.shape[0]
    num_edges = edge_index.shape[1]
    slices = slices.to(torch.int64)
    sizes = sizes.to(torch.int64)
    if int(slices[0]) != 0 or int(slices[-1]) != num_edges:
        raise ValueError(
            f"slices must start at 0 and end at the number of edges {num_edges}, got "
            f"{int(slices[0])} .. {int(slices[-1])}"
        )
    edge_counts = slices[1:] - slices[:-1]
    if bool((edge_counts < 0).any()):
        raise ValueError("slices must be non-decreasing")
    if num_graphs and int(sizes.max()) > max_nodes:
        raise ValueError(
            f"max_nodes={max_nodes} is below the largest graph size {int(sizes.max())}"
        )

    adjacency = torch.zeros(num_graphs, max_nodes, max_nodes, dtype=torch.int32)
    if num_edges == 0:
        return adjacency
    graph_of_edge = torch.repeat_interleave(torch.arange(num_graphs), edge_counts)
    src = edge_index[0].to(torch.int64)
    dst = edge_index[1].to(torch.int64)
    limit = sizes[graph_of_edge]
    bad = (src < 0) | (dst < 0) | (src >= limit) | (dst >= limit)
    if bool(bad.any()):
        first = int(torch.nonzero(bad)[0, 0])
        raise ValueError(
            f"edge {first} ({int(src[first])} -> {int(dst[first])}) of graph "
            f"{int(graph_of_edge[first])} is out of range for its size {int(limit[first])}"
        )
    adjacency[graph_of_edge, src, dst] = 1
    return adjacency


def dense_to_sparse(adjacency: Tensor) -> tuple[Tensor, Tensor]:
    """Turn a batch of dense adjacency matrices into the on-disk sparse format.

    Parameters
    ----------
    adjacency : Tensor
        Tensor of shape ``(N, n, n)``; every non-zero entry ``[g, i, j]`` becomes the edge
        ``i -> j`` of graph ``g``. For undirected graphs pass symmetric matrices, so that
        each edge appears in both directions.

    Returns
    -------
    edge_index : Tensor
        ``int64`` tensor of shape ``(2, E)`` with per-graph local node indices, sorted by
        (graph, source, target), so the output is a deterministic function of the input.
    slices : Tensor
        ``int64`` tensor of shape ``(N + 1,)``: cumulative edge counts starting at 0. A
        graph without edges repeats the previous value (the original library's converter
        dropped trailing edgeless graphs from ``slices``; this one does not).
    """
    if adjacency.ndim != 3 or adjacency.shape[1] != adjacency.shape[2]:
        raise ValueError(f"adjacency must have shape (N, n, n), got {tuple(adjacency.shape)}")
    num_graphs = adjacency.shape[0]
    # nonzero() enumerates in row-major order, i.e. sorted by (graph, source, target).
    graph, src, dst = torch.nonzero(adjacency, as_tuple=True)
    edge_index = torch.stack((src, dst)).to(torch.int64)
    counts = torch.bincount(graph, minlength=num_graphs)
    slices = torch.zeros(num_graphs + 1, dtype=torch.int64)
    slices[1:] = torch.cumsum(counts, 0)
    return edge_index, slices

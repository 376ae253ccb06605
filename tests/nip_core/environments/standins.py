"""Small stand-ins used by the environment/agent/trainer tests.

``RandomGraphDataset`` is a tiny dataset of graph pairs (isomorphic pairs are random
relabellings; non-isomorphic pairs are independent ER graphs, of density ``non_iso_p`` against
0.5: 0.15 makes them easy, 0.5 makes both graphs look alike).
"""

from __future__ import annotations

import torch
from tensordict import TensorDict

from nip_core.protocols import build_protocol_handler


def make_protocol(hp):
    """The protocol handler of ``hp`` (the real one, from ``nip_core.protocols``)."""
    return build_protocol_handler(hp)


class RandomGraphDataset:
    """``n`` graph pairs on ``max_nodes`` nodes (sizes ``min_nodes..max_nodes``), seeded."""

    def __init__(self, n: int = 32, max_nodes: int = 8, min_nodes: int = 5, seed: int = 0,
                 non_iso_p: float = 0.15):
        g = torch.Generator().manual_seed(seed)
        self.max_nodes = max_nodes
        adjacency = torch.zeros(n, 2, max_nodes, max_nodes, dtype=torch.int32)
        node_mask = torch.zeros(n, 2, max_nodes, dtype=torch.bool)
        y = torch.arange(n) % 2
        for i in range(n):
            size = int(torch.randint(min_nodes, max_nodes + 1, (1,), generator=g))
            a = (torch.rand(size, size, generator=g) < 0.5).int().triu(1)
            a = a + a.T
            if y[i] == 1:
                perm = torch.randperm(size, generator=g)
                b = a[perm][:, perm]
            else:
                b = (torch.rand(size, size, generator=g) < non_iso_p).int().triu(1)
                b = b + b.T
            adjacency[i, 0, :size, :size] = a
            adjacency[i, 1, :size, :size] = b
            node_mask[i, :, :size] = True
        self.data = TensorDict({"adjacency": adjacency, "node_mask": node_mask, "y": y.long(),
                                "id": torch.arange(n)}, batch_size=(n,))

    def __len__(self) -> int:
        return self.data.batch_size[0]

    def __getitem__(self, index):
        return self.data[index]

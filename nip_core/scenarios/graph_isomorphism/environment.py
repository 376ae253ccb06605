"""The graph-isomorphism environment: messages are nodes of either graph.

A message is one node of one of the two graphs, i.e. an index into the flattened
``(2, max_nodes)`` message space (``node_selected = graph * max_nodes + node``). The
datapoint's ``adjacency`` and ``node_mask`` are observations copied at reset and passed
through every step (docs/behaviour.md#b17).
"""

from __future__ import annotations

from typing import Any

import torch
from torchrl.data import Binary, Categorical

from nip_core.environments.tensordict_env import TensorDictEnvironment


class GraphIsomorphismEnvironment(TensorDictEnvironment):
    """:class:`TensorDictEnvironment` over pairs of graphs.

    The dataset must provide ``adjacency`` int32 ``(N, 2, max_nodes, max_nodes)``,
    ``node_mask`` bool ``(N, 2, max_nodes)``, ``y`` and ``max_nodes``.
    """

    main_message_out_key = "node_selected"
    datapoint_keys = ("adjacency", "node_mask")

    def __init__(self, hyper_params, dataset, protocol_handler, seed: int = 0, device: str = "cpu"):
        self.max_nodes = int(dataset.max_nodes)
        super().__init__(hyper_params, dataset, protocol_handler, seed=seed, device=device)

    @property
    def main_message_space_shape(self) -> tuple[int, ...]:
        return (2, self.max_nodes)

    def _scenario_observation_specs(self) -> dict[str, Any]:
        B, N = self.num_envs, self.max_nodes
        return {
            "adjacency": Categorical(2, shape=(B, 2, N, N), dtype=torch.int32),
            "node_mask": Binary(shape=(B, 2, N), dtype=torch.bool),
        }

"""Helpers of the ``nipflow evaluate`` tests: graph pairs, files in the original format, tiny runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from nip_core.runs import RunStore
from nip_core.scenarios.graph_isomorphism.build import build_graph_isomorphism
from nip_core.scenarios.graph_isomorphism.original_format import read_dataset_file, write_original_format
from tests.nip_core.trainers.gi_helpers import settings_for, tiny_params

TRAIN_MAX_NODES = 6
BIG_MAX_NODES = 9
NUM_BIG_PAIRS = 30


def graph_pairs(n: int, min_nodes: int, max_nodes: int, seed: int):
    """``(adjacency (n, 2, max, max), sizes (n,), wl_scores (n,))``: even pairs isomorphic (-1).

    Odd pairs pair a dense graph with a sparse one and get the scores 1, 2, 3 in turn.
    """
    rng = np.random.default_rng(seed)
    adjacency = np.zeros((n, 2, max_nodes, max_nodes), dtype=np.int64)
    sizes = np.zeros(n, dtype=np.int64)
    scores = np.zeros(n, dtype=np.int64)
    for i in range(n):
        size = int(rng.integers(min_nodes, max_nodes + 1))
        sizes[i] = size
        a = np.triu((rng.random((size, size)) < 0.5).astype(np.int64), 1)
        a = a + a.T
        if i % 2 == 0:
            perm = rng.permutation(size)
            b, scores[i] = a[perm][:, perm], -1
        else:
            b = np.triu((rng.random((size, size)) < 0.2).astype(np.int64), 1)
            b, scores[i] = b + b.T, 1 + (i // 2) % 3
        adjacency[i, 0, :size, :size] = a
        adjacency[i, 1, :size, :size] = b
    return adjacency, sizes, scores


def write_files(directory: Path) -> dict[str, Path]:
    """Train/test files (graphs of 4-6 nodes) and a file of larger graphs (7-9 nodes)."""
    files = {"train": directory / "train.pt", "test": directory / "test.pt", "big": directory / "big.pt"}
    write_original_format(files["train"], *graph_pairs(24, 4, TRAIN_MAX_NODES, seed=0))
    write_original_format(files["test"], *graph_pairs(24, 4, TRAIN_MAX_NODES, seed=1))
    write_original_format(files["big"], *graph_pairs(NUM_BIG_PAIRS, 7, BIG_MAX_NODES, seed=2))
    return files


def train_tiny_run(runs_dir: Path, files: dict[str, Path], run_id: str = "gi", trainer: str = "vanilla_ppo"):
    """Train a tiny GI run on ``files`` (2 PPO iterations or 2 solo epochs); return its params."""
    from nip_core.trainers import get_trainer_class

    if trainer == "solo_agent":
        hp = tiny_params("solo_agent", solo_agent=dict(num_epochs=2, batch_size=8))
    else:
        hp = tiny_params(trainer, rl=dict(num_iterations=2))
    settings = settings_for(runs_dir, run_id=run_id)
    run = RunStore(str(runs_dir)).open_run(run_id, hp)
    cls = get_trainer_class(trainer)
    scenario = build_graph_isomorphism(hp, settings, trainer_type=cls.trainer_type,
                                       train_dataset=read_dataset_file(files["train"]),
                                       test_dataset=read_dataset_file(files["test"]))
    trainer_obj = cls(hp, settings=settings, run=run, scenario_instance=scenario)
    try:
        trainer_obj.train()
    finally:
        trainer_obj.close()
    return hp

"""Generate datasets of graph pairs labelled by their Weisfeiler–Lehman score.

Graphs are Erdős–Rényi: each of the ``n(n-1)/2`` possible edges is present
independently with probability ``p`` (see :mod:`.erdos_renyi`). A dataset of
``num_samples`` pairs has

1. **Non-isomorphic pairs** (``prop_non_isomorphic`` of the samples), split equally
   over the (size, edge probability) cells. In each cell, independent ER pairs are drawn
   and kept, in draw order, while the quota of their class has room: ``score == 1``,
   ``score == 2`` or ``score > 2``. Pairs that WL cannot tell apart within
   ``max_iterations`` (score -1) are never kept, so — as in the original library —
   "non-isomorphic" here means *WL-distinguishable*: pairs that are non-isomorphic but
   WL-equivalent are discarded. This keeps the task solvable by a message-passing GNN,
   whose distinguishing power is bounded by the WL test.
2. **Isomorphic pairs from the non-isomorphic set** (``iso_prop_from_non_iso`` of the
   isomorphic ones): a uniformly chosen graph of a uniformly chosen non-isomorphic pair,
   duplicated.
3. **Fresh isomorphic pairs**: the remainder, as ER graphs spread evenly over the cells
   (the last cell takes the remainder of the division), duplicated.

Both graphs of every isomorphic pair are then independently node-permuted (padding
stays in place), and get score -1.

Determinism: all randomness derives from ``config.seed``, through
``numpy.random.SeedSequence(seed, spawn_key=...)`` children: one group of streams per
cell and one for the isomorphic phase. Every stream is consumed strictly in candidate
order, so the output depends only on the config (and the numpy version) — not on
``batch_size``, nor on ``num_workers`` (cells may be generated in parallel). A single
shared generator could not give that: how far a cell reads ahead of its last kept pair
depends on the batch size, and that would shift every later cell.

Cost: pairs of WL score above 2 are rare (for 11 nodes and ``p`` 0.4 or 0.6 about 6 in
10^8 ER pairs), so a cell may draw billions of candidates. A candidate costs about
0.13 µs of CPU: edges are drawn bit-packed; pairs with different edge counts have different
degree histograms, hence score 1; degree histograms (by popcount) are compared only for
the rest, and the full WL refinement runs only on pairs whose degree histograms agree.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import math
import multiprocessing
import os
import time
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from nip_core.scenarios.graph_isomorphism.erdos_renyi import (
    BLOCK_GRAPHS,
    NUM_LEVELS,
    ErdosRenyiSampler,
)
from nip_core.scenarios.graph_isomorphism.wl import wl_scores

__all__ = [
    "GraphIsomorphismDatasetConfig",
    "GeneratedPairs",
    "DatasetGenerationError",
    "QuotaUnreachableError",
    "generate_gi_dataset",
    "shuffle_adjacencies",
    "non_isomorphic_quotas",
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_MAX_CANDIDATES_PER_CELL",
]

logger = logging.getLogger(__name__)

#: Candidate pairs scored at once; a performance knob only (it does not change output).
DEFAULT_BATCH_SIZE = 1 << 16
#: Candidate pairs drawn in one cell before giving up on its quotas (about half an hour
#: of CPU; the default config's hardest cells need about 3e9 for 10,000 samples).
DEFAULT_MAX_CANDIDATES_PER_CELL = 12_000_000_000
_PAIRS_PER_BLOCK = BLOCK_GRAPHS // 2
# Long cells log their progress every this many candidates.
_PROGRESS_EVERY = 500_000_000

# Guards float products such as 0.58 * 100 = 57.99999999999999 against flooring down.
_FLOOR_EPS = 1e-9


class GraphIsomorphismDatasetConfig(BaseModel):
    """Configuration of a generated graph-isomorphism dataset (see the module docstring).

    Parameters
    ----------
    num_samples : int
        Number of graph pairs.
    graph_sizes : list[int]
        Node counts of the graphs; each size forms cells with each edge probability.
    edge_probabilities : list[float]
        Erdős–Rényi edge probabilities.
    max_iterations : int
        Iterations of WL refinement used to score pairs.
    prop_non_isomorphic : float
        Proportion of pairs that are (WL-distinguishable) non-isomorphic.
    non_iso_prop_score_1, non_iso_prop_score_2 : float
        Proportions of each cell's non-isomorphic pairs with score 1 and 2; the rest
        have score above 2.
    iso_prop_from_non_iso : float
        Proportion of the isomorphic pairs built from graphs of the non-isomorphic set.
    seed : int
        Seed of all randomness.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    num_samples: int = Field(ge=1)
    graph_sizes: list[int] = Field(default_factory=lambda: [7, 8, 9, 10, 11], min_length=1)
    edge_probabilities: list[float] = Field(
        default_factory=lambda: [0.2, 0.4, 0.6, 0.8], min_length=1
    )
    max_iterations: int = Field(default=5, ge=1)
    prop_non_isomorphic: float = Field(default=0.5, ge=0.0, le=1.0)
    non_iso_prop_score_1: float = Field(default=0.1, ge=0.0, le=1.0)
    non_iso_prop_score_2: float = Field(default=0.2, ge=0.0, le=1.0)
    iso_prop_from_non_iso: float = Field(default=0.5, ge=0.0, le=1.0)
    seed: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _check_consistency(self) -> GraphIsomorphismDatasetConfig:
        if any(size < 1 for size in self.graph_sizes):
            raise ValueError(f"graph_sizes must be positive, got {self.graph_sizes}")
        if any(not 0.0 <= p <= 1.0 for p in self.edge_probabilities):
            raise ValueError(
                f"edge_probabilities must lie in [0, 1], got {self.edge_probabilities}"
            )
        if self.non_iso_prop_score_1 + self.non_iso_prop_score_2 > 1.0 + _FLOOR_EPS:
            raise ValueError("non_iso_prop_score_1 + non_iso_prop_score_2 must not exceed 1")
        return self

    @property
    def cells(self) -> list[tuple[int, float]]:
        """The (graph size, edge probability) cells, in generation order."""
        return list(itertools.product(self.graph_sizes, self.edge_probabilities))

    @property
    def max_nodes(self) -> int:
        """The padded size of every adjacency matrix."""
        return max(self.graph_sizes)


class DatasetGenerationError(ValueError):
    """A dataset configuration cannot be generated."""


class QuotaUnreachableError(DatasetGenerationError):
    """A cell's quota of non-isomorphic pairs of some WL-score class cannot be filled."""


@dataclass(frozen=True)
class GeneratedPairs:
    """Generated graph pairs in dense form.

    Attributes
    ----------
    adjacency : np.ndarray
        ``int8``, ``(N, 2, max_nodes, max_nodes)``, zero-padded.
    sizes : np.ndarray
        ``int32``, ``(N,)``: node count of both graphs of each pair.
    wl_scores : np.ndarray
        ``int32``, ``(N,)``: WL score, -1 for isomorphic pairs.
    config : GraphIsomorphismDatasetConfig
    """

    adjacency: np.ndarray
    sizes: np.ndarray
    wl_scores: np.ndarray
    config: GraphIsomorphismDatasetConfig


def non_isomorphic_quotas(config: GraphIsomorphismDatasetConfig) -> tuple[int, int, int]:
    """Per-cell numbers of non-isomorphic pairs with score 1, score 2 and score > 2."""
    per_cell = config.num_samples * config.prop_non_isomorphic / len(config.cells)
    score_1 = math.floor(per_cell * config.non_iso_prop_score_1 + _FLOOR_EPS)
    score_2 = math.floor(per_cell * config.non_iso_prop_score_2 + _FLOOR_EPS)
    return score_1, score_2, math.floor(per_cell + _FLOOR_EPS) - score_1 - score_2


def generate_gi_dataset(
    config: GraphIsomorphismDatasetConfig,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    max_candidates_per_cell: int = DEFAULT_MAX_CANDIDATES_PER_CELL,
    num_workers: int | None = 1,
) -> GeneratedPairs:
    """Generate the graph pairs described by ``config``.

    Parameters
    ----------
    config : GraphIsomorphismDatasetConfig
    batch_size : int
        Candidate pairs drawn and scored at once (memory/speed only; rounded up to a
        whole number of sampler blocks).
    max_candidates_per_cell : int
        Candidate pairs drawn in a cell before raising :class:`QuotaUnreachableError`.
    num_workers : int or None
        Processes generating cells in parallel (1: in this process). ``None``: decided
        here — the first cell is generated in this process and, when the rest would take
        more than :data:`AUTO_PARALLEL_MIN_S` at its pace, the others in one process per
        usable core (the output is the same either way).

    Returns
    -------
    GeneratedPairs
        Non-isomorphic pairs cell by cell (in draw order within a cell), then the
        isomorphic pairs copied from them, then the fresh isomorphic pairs.

    Raises
    ------
    QuotaUnreachableError
        If a cell cannot supply its quota of some score class (impossible by
        construction, or not found within ``max_candidates_per_cell`` draws).
    DatasetGenerationError
        If isomorphic pairs must come from an empty non-isomorphic set.
    """
    quotas = non_isomorphic_quotas(config)
    cells = config.cells
    for size, p in cells:
        _check_reachable(size, p, quotas, config.max_iterations)

    jobs = [
        (config.seed, index, size, p, quotas, config.max_iterations, batch_size,
         max_candidates_per_cell)
        for index, (size, p) in enumerate(cells)
    ]
    if num_workers is None:
        cell_results = _sample_cells_auto(jobs)
    elif num_workers > 1 and sum(quotas) > 0:
        cell_results = _sample_cells_in_processes(jobs, num_workers)
    else:
        cell_results = [_sample_cell(*job) for job in jobs]

    max_nodes = config.max_nodes
    non_iso_adj = np.concatenate(
        [_pad(adjacency, max_nodes) for adjacency, _ in cell_results]
    )
    non_iso_sizes = np.repeat(
        np.array([size for size, _ in cells], dtype=np.int32),
        [len(scores) for _, scores in cell_results],
    )
    non_iso_scores = np.concatenate([scores for _, scores in cell_results])

    iso_adj, iso_sizes = _isomorphic_pairs(config, non_iso_adj, non_iso_sizes)
    return GeneratedPairs(
        adjacency=np.concatenate((non_iso_adj, iso_adj)),
        sizes=np.concatenate((non_iso_sizes, iso_sizes)).astype(np.int32),
        wl_scores=np.concatenate(
            (non_iso_scores, np.full(len(iso_sizes), -1, dtype=np.int32))
        ).astype(np.int32),
        config=config,
    )


def shuffle_adjacencies(
    rng: np.random.Generator, adjacency: np.ndarray, sizes: np.ndarray
) -> np.ndarray:
    """Permute the real nodes of each graph uniformly at random; padding stays in place.

    Parameters
    ----------
    rng : np.random.Generator
    adjacency : np.ndarray
        ``(..., n, n)``.
    sizes : np.ndarray
        ``(...)``: the real node count of each graph.
    """
    n = adjacency.shape[-1]
    positions = np.arange(n)
    # Real nodes get keys in [0, 1), padding keys n + position: sorting the keys gives a
    # random permutation of the real nodes followed by the identity on the padding.
    keys = rng.random(adjacency.shape[:-1])
    keys = np.where(positions < sizes[..., None], keys, n + positions)
    perm = np.argsort(keys, axis=-1, kind="stable")
    permuted = np.take_along_axis(adjacency, perm[..., :, None], axis=-2)
    return np.take_along_axis(permuted, perm[..., None, :], axis=-1)


def _streams(seed: int, *spawn_key: int, count: int) -> list[np.random.SeedSequence]:
    """``count`` independent seed sequences for the stream group ``spawn_key``."""
    return [np.random.SeedSequence(seed, spawn_key=(*spawn_key, i)) for i in range(count)]


def _check_reachable(
    size: int, p: float, quotas: tuple[int, int, int], max_iterations: int
) -> None:
    cell = f"cell (size={size}, p={p})"
    if sum(quotas) > 0 and (p in (0.0, 1.0) or size < 2):
        raise QuotaUnreachableError(
            f"{cell}: all its graphs are identical, but {sum(quotas)} non-isomorphic "
            "pairs per cell are required"
        )
    if quotas[1] + quotas[2] > 0 and size <= 3:
        # On at most 3 nodes, graphs with equal edge counts are isomorphic.
        raise QuotaUnreachableError(
            f"{cell}: graphs this small are only ever told apart by their edge counts "
            f"(score 1), but {quotas[1] + quotas[2]} pairs with score >= 2 are required"
        )
    for label, quota, needed in (("score 2", quotas[1], 2), ("score > 2", quotas[2], 3)):
        if quota > 0 and max_iterations < needed:
            raise QuotaUnreachableError(
                f"{cell}: {quota} pairs with {label} are required but max_iterations="
                f"{max_iterations} cannot produce that score"
            )


#: ``num_workers=None``: cells after the first go to worker processes when, at the first
#: cell's pace, they would take longer than this. The first cell (smallest graphs, sparsest)
#: is the cheapest, so this is a low bar: ``small``'s splits estimated 6 s and 2 s and took
#: about 60 s and 12 s in one process; a worker process costs about a second to start.
AUTO_PARALLEL_MIN_S = 1.0


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _sample_cells_in_processes(jobs: list[tuple], num_workers: int) -> list[tuple[np.ndarray, np.ndarray]]:
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(num_workers, mp_context=context) as pool:
        return list(pool.map(_sample_cell, *zip(*jobs)))


def _sample_cells_auto(jobs: list[tuple]) -> list[tuple[np.ndarray, np.ndarray]]:
    """The first cell here; the rest here too or in one process per usable core (see
    :data:`AUTO_PARALLEL_MIN_S`)."""
    if not jobs:
        return []
    start = time.perf_counter()
    first = _sample_cell(*jobs[0])
    rest = jobs[1:]
    estimate = (time.perf_counter() - start) * len(rest)
    workers = min(_usable_cores(), len(rest))
    if workers > 1 and estimate > AUTO_PARALLEL_MIN_S:
        logger.info("generating %d more cells in %d processes (about %.0f s in one)", len(rest), workers, estimate)
        return [first, *_sample_cells_in_processes(rest, workers)]
    return [first, *(_sample_cell(*job) for job in rest)]


def _sample_cell(
    seed: int,
    cell_index: int,
    size: int,
    p: float,
    quotas: tuple[int, int, int],
    max_iterations: int,
    batch_size: int,
    max_candidates: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Rejection-sample one cell's non-isomorphic pairs, kept in draw order.

    Candidate pair ``k`` is graphs ``2k`` and ``2k + 1`` of the cell's sampler; it is
    kept when its score class still has room.

    Returns ``(adjacency int8 (q, 2, size, size), scores int32 (q,))``.
    """
    sampler = ErdosRenyiSampler(size, p, _streams(seed, cell_index, count=NUM_LEVELS))
    wpg = sampler.words_per_graph
    blocks_per_batch = max(1, -(-batch_size // _PAIRS_PER_BLOCK))
    remaining = list(quotas)
    kept_words = [np.zeros((0, 2, wpg), dtype=np.uint64)]
    kept_scores = [np.zeros(0, dtype=np.int32)]
    kept_order = [np.zeros(0, dtype=np.int64)]
    drawn = 0
    while any(remaining):
        if drawn >= max_candidates:
            found = [q - r for q, r in zip(quotas, remaining)]
            raise QuotaUnreachableError(
                f"cell (size={size}, p={p}): after {drawn} candidate pairs found "
                f"{found} of the required {list(quotas)} pairs with score 1, 2, > 2; "
                "raise max_candidates_per_cell or change the config"
            )
        blocks = min(blocks_per_batch, -(-(max_candidates - drawn) // _PAIRS_PER_BLOCK))
        words = sampler.sample_blocks(blocks).reshape(-1, 2, wpg)
        scores = _score_candidates(sampler, words, max_iterations)
        for cls, members in enumerate((scores == 1, scores == 2, scores > 2)):
            take = np.flatnonzero(members)[: remaining[cls]]
            remaining[cls] -= take.size
            kept_words.append(words[take])
            kept_scores.append(scores[take])
            kept_order.append(drawn + take)
        drawn += words.shape[0]
        if drawn // _PROGRESS_EVERY != (drawn - words.shape[0]) // _PROGRESS_EVERY:
            found = [q - r for q, r in zip(quotas, remaining)]
            logger.info(
                "cell (size=%d, p=%s): %d candidates drawn, found %s of %s",
                size, p, drawn, found, list(quotas),
            )
    logger.info("cell (size=%d, p=%s): %d candidate pairs drawn", size, p, drawn)
    order = np.argsort(np.concatenate(kept_order), kind="stable")
    adjacency = sampler.to_adjacency(np.concatenate(kept_words)[order])
    return adjacency, np.concatenate(kept_scores)[order]


def _score_candidates(
    sampler: ErdosRenyiSampler, words: np.ndarray, max_iterations: int
) -> np.ndarray:
    """WL scores of candidate pairs ``words (P, 2, words_per_graph)``.

    Equal to ``wl_scores`` on the adjacency matrices, computed in stages: different
    edge counts or degree histograms mean score 1 without building any matrix.
    """
    scores = np.ones(words.shape[0], dtype=np.int32)
    counts = sampler.edge_counts(words)
    candidates = np.flatnonzero(counts[:, 0] == counts[:, 1])
    degrees = sampler.degrees(words[candidates])  # (c, 2, size)
    if sampler.size <= 15:
        # A degree histogram (counts < 16 of degrees < 15) is one base-16 int64 key.
        keys = (16 ** np.arange(sampler.size, dtype=np.int64))[degrees].sum(axis=-1)
        same = keys[:, 0] == keys[:, 1]
    else:
        ordered = np.sort(degrees, axis=-1)
        same = (ordered[:, 0] == ordered[:, 1]).all(axis=-1)
    survivors = candidates[same]
    if survivors.size:
        adjacency = sampler.to_adjacency(words[survivors])
        scores[survivors] = wl_scores(adjacency[:, 0], adjacency[:, 1], max_iterations)
    return scores


def _isomorphic_pairs(
    config: GraphIsomorphismDatasetConfig,
    non_iso_adj: np.ndarray,
    non_iso_sizes: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Build the isomorphic pairs: copies from the non-iso set, then fresh graphs."""
    num_cells = len(config.cells)
    # Stream group ``num_cells`` holds the choices and permutations, then one group per
    # cell for its fresh graphs.
    rng = np.random.Generator(np.random.PCG64(_streams(config.seed, num_cells, count=1)[0]))
    max_nodes = config.max_nodes
    num_from_non_iso = math.floor(
        config.num_samples * (1 - config.prop_non_isomorphic) * config.iso_prop_from_non_iso
        + _FLOOR_EPS
    )
    num_non_iso = len(non_iso_sizes)
    if num_from_non_iso > 0 and num_non_iso == 0:
        raise DatasetGenerationError(
            f"{num_from_non_iso} isomorphic pairs should be copied from the non-isomorphic "
            "pairs, but the config has none (raise prop_non_isomorphic or set "
            "iso_prop_from_non_iso=0)"
        )
    pair_index = rng.integers(0, max(num_non_iso, 1), size=num_from_non_iso)
    member = rng.integers(0, 2, size=num_from_non_iso)
    graphs = [non_iso_adj[pair_index, member]]
    sizes = [non_iso_sizes[pair_index]]

    num_fresh = config.num_samples - num_non_iso - num_from_non_iso
    per_cell = num_fresh // num_cells
    for index, (size, p) in enumerate(config.cells):
        count = per_cell if index < num_cells - 1 else num_fresh - per_cell * (num_cells - 1)
        sampler = ErdosRenyiSampler(
            size, p, _streams(config.seed, num_cells + 1 + index, count=NUM_LEVELS)
        )
        words = sampler.sample_blocks(-(-count // BLOCK_GRAPHS))[:count]
        graphs.append(_pad(sampler.to_adjacency(words), max_nodes))
        sizes.append(np.full(count, size, dtype=np.int32))

    graphs_all = np.concatenate(graphs)
    sizes_all = np.concatenate(sizes).astype(np.int32)
    pairs = np.stack((graphs_all, graphs_all), axis=1)
    pairs = shuffle_adjacencies(rng, pairs, np.stack((sizes_all, sizes_all), axis=1))
    return pairs, sizes_all


def _pad(adjacency: np.ndarray, max_nodes: int) -> np.ndarray:
    """Zero-pad the last two axes to ``max_nodes``."""
    extra = max_nodes - adjacency.shape[-1]
    if extra == 0:
        return adjacency
    width = [(0, 0)] * (adjacency.ndim - 2) + [(0, extra), (0, extra)]
    return np.pad(adjacency, width)

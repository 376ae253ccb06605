"""Fast, reproducible Erdős–Rényi graph sampling into bit-packed edge words.

A graph on ``n`` nodes has ``m = n(n-1)/2`` possible edges (the strict upper triangle,
in ``numpy.triu_indices`` order); edge ``e`` is bit ``e % 64`` of word ``e // 64``.

Each edge is present with probability ``p`` truncated to 32 binary digits (within
``2**-32`` of ``p``, finer than the ``float32`` draws of the original library). Edge
bits are computed 64 at a time ("bit-sliced"): an edge is present when a uniform
``U`` is below ``p``, and ``U``'s binary digits are random bits, so the comparison is
settled at the first digit where ``U`` and ``p`` differ. Digits 1–8 are drawn for every
graph; the rare graphs with an edge still undecided draw digits 9–16, and so on up to
32 (undecided after that means ``U >= p``, i.e. absent). Rejection sampling of rare
pairs draws billions of graphs, and this costs about 8 random 64-bit words per graph
instead of one ``float`` per edge.

Reproducibility: digits ``8(l-1)+1 .. 8l`` come from stream ``l`` (four
``numpy.random.SFC64`` streams), consumed strictly in graph order, in blocks of
:data:`BLOCK_GRAPHS` graphs. Drawing ``k`` blocks at once or one at a time yields the
same graphs, so callers' batch sizes never change the output.
"""

from __future__ import annotations

import numpy as np

__all__ = ["ErdosRenyiSampler", "BLOCK_GRAPHS", "NUM_LEVELS"]

#: Graphs per block of the main stream; samples are drawn in whole blocks.
BLOCK_GRAPHS = 1024
#: Refinement levels of 8 binary digits each (32 digits of precision).
NUM_LEVELS = 4
_DIGITS_PER_LEVEL = 8


class ErdosRenyiSampler:
    """Sampler of ``G(n, p)`` graphs as edge words.

    Parameters
    ----------
    size : int
        Number of nodes ``n``.
    edge_probability : float
        ``p`` in ``[0, 1]``.
    seed_sequences : list[np.random.SeedSequence]
        :data:`NUM_LEVELS` seed sequences, one per refinement level.
    """

    def __init__(
        self,
        size: int,
        edge_probability: float,
        seed_sequences: list[np.random.SeedSequence],
    ):
        if len(seed_sequences) != NUM_LEVELS:
            raise ValueError(f"need {NUM_LEVELS} seed sequences, got {len(seed_sequences)}")
        if not 0.0 <= edge_probability <= 1.0:
            raise ValueError(f"edge_probability must lie in [0, 1], got {edge_probability}")
        self.size = size
        self.edge_probability = edge_probability
        self.num_slots = size * (size - 1) // 2
        self.words_per_graph = max(1, -(-self.num_slots // 64))
        self._streams = [np.random.SFC64(seq) for seq in seed_sequences]
        # Bits of each word that are real edges (the last word may be partly unused).
        lanes = np.zeros(self.words_per_graph, dtype=np.uint64)
        for word in range(self.words_per_graph):
            used = min(64, self.num_slots - 64 * word)
            lanes[word] = np.uint64((1 << used) - 1) if used > 0 else np.uint64(0)
        self.lane_mask = lanes
        truncated = min(int(edge_probability * 2**32), 2**32 - 1)
        self._digits = [(truncated >> (31 - i)) & 1 for i in range(32)]
        self._always = edge_probability >= 1.0
        # Bits of each node's incident edges, for degrees by popcount.
        self._node_masks = np.zeros((size, self.words_per_graph), dtype=np.uint64)
        for slot, (u, v) in enumerate(zip(*np.triu_indices(size, 1))):
            bit = np.uint64(1 << (slot % 64))
            self._node_masks[u, slot // 64] |= bit
            self._node_masks[v, slot // 64] |= bit

    def sample_blocks(self, num_blocks: int) -> np.ndarray:
        """Draw ``num_blocks * BLOCK_GRAPHS`` graphs.

        Returns
        -------
        words : np.ndarray
            ``uint64``, shape ``(num_blocks * BLOCK_GRAPHS, words_per_graph)``.
        """
        num_graphs = num_blocks * BLOCK_GRAPHS
        wpg = self.words_per_graph
        width = BLOCK_GRAPHS * wpg
        lanes = np.tile(self.lane_mask, BLOCK_GRAPHS)  # (width,)

        # Level 1 for every graph; layout (block, digit, graph-word) keeps each digit's
        # words contiguous while the stream is still consumed block after block.
        raw = self._streams[0].random_raw(num_blocks * _DIGITS_PER_LEVEL * width)
        raw = raw.reshape(num_blocks, _DIGITS_PER_LEVEL, width)
        present = np.zeros((num_blocks, width), dtype=np.uint64)
        undecided = np.broadcast_to(lanes, (num_blocks, width)).copy()
        self._compare(raw, self._digits[:_DIGITS_PER_LEVEL], present, undecided)
        present = present.reshape(num_graphs, wpg)
        undecided = undecided.reshape(num_graphs, wpg)

        # Later levels only for graphs with an undecided edge, in graph order.
        pending = np.flatnonzero(undecided.any(axis=1))
        for level in range(1, NUM_LEVELS):
            if pending.size == 0:
                break
            raw = self._streams[level].random_raw(pending.size * _DIGITS_PER_LEVEL * wpg)
            raw = raw.reshape(pending.size, _DIGITS_PER_LEVEL, wpg)
            sub_present = present[pending]
            sub_undecided = undecided[pending]
            digits = self._digits[level * _DIGITS_PER_LEVEL : (level + 1) * _DIGITS_PER_LEVEL]
            self._compare(raw, digits, sub_present, sub_undecided)
            present[pending] = sub_present
            undecided[pending] = sub_undecided
            pending = pending[sub_undecided.any(axis=1)]

        if self._always:
            present[:] = self.lane_mask
        return present

    @staticmethod
    def _compare(
        raw: np.ndarray, digits: list[int], present: np.ndarray, undecided: np.ndarray
    ) -> None:
        """Settle edges at the next digits: ``raw[:, i]`` holds digit ``i`` of ``U``."""
        scratch = np.empty_like(present)
        for i, digit in enumerate(digits):
            u_digit = raw[:, i]
            np.invert(u_digit, out=scratch)
            if digit:
                # U digit 0 < p digit 1: U < p, edge present; U digit 1 stays undecided.
                scratch &= undecided
                present |= scratch
                undecided &= u_digit
            else:
                # U digit 1 > p digit 0: U > p, edge absent; U digit 0 stays undecided.
                undecided &= scratch

    def edge_counts(self, words: np.ndarray) -> np.ndarray:
        """Number of edges of each graph, ``(..., words_per_graph) -> (...)``."""
        return np.bitwise_count(words).sum(axis=-1, dtype=np.int64)

    def degrees(self, words: np.ndarray) -> np.ndarray:
        """Node degrees, ``(..., words_per_graph) -> (..., size)``."""
        masked = words[..., None, :] & self._node_masks  # (..., size, words_per_graph)
        return np.bitwise_count(masked).sum(axis=-1, dtype=np.int64)

    def to_adjacency(self, words: np.ndarray) -> np.ndarray:
        """Symmetric ``int8`` adjacency, ``(..., words_per_graph) -> (..., size, size)``."""
        batch_shape = words.shape[:-1]
        flat = np.ascontiguousarray(words.reshape(-1, self.words_per_graph)).astype("<u8")
        bits = np.unpackbits(flat.view(np.uint8), axis=-1, bitorder="little")
        bits = bits[:, : self.num_slots]
        rows, cols = np.triu_indices(self.size, 1)
        adjacency = np.zeros((bits.shape[0], self.size, self.size), dtype=np.int8)
        adjacency[:, rows, cols] = bits
        adjacency[:, cols, rows] = bits
        return adjacency.reshape(batch_shape + (self.size, self.size))

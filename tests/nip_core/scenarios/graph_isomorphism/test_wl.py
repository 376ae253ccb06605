"""Tests of the exact 1-WL scores (nip_core.scenarios.graph_isomorphism.wl)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from nip_core.scenarios.graph_isomorphism.wl import wl_colours, wl_score, wl_scores


def graph(num_nodes: int, edges: list[tuple[int, int]]) -> np.ndarray:
    adjacency = np.zeros((num_nodes, num_nodes), dtype=np.int8)
    for u, v in edges:
        adjacency[u, v] = adjacency[v, u] = 1
    return adjacency


def permute(adjacency: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    perm = rng.permutation(adjacency.shape[0])
    return adjacency[np.ix_(perm, perm)]


def reference_wl(adj_a: np.ndarray, adj_b: np.ndarray, max_iterations: int) -> int:
    """Textbook joint colour refinement with tuple signatures (no shortcuts)."""
    if adj_a.shape[0] != adj_b.shape[0]:
        return 0
    nodes = [(g, v) for g, adj in enumerate((adj_a, adj_b)) for v in range(adj.shape[0])]
    adjs = (adj_a, adj_b)
    colours = {node: 0 for node in nodes}
    for iteration in range(1, max_iterations + 1):
        signature = {
            (g, v): (
                colours[(g, v)],
                tuple(sorted(colours[(g, u)] for u in np.flatnonzero(adjs[g][v]))),
            )
            for g, v in nodes
        }
        palette = {sig: i for i, sig in enumerate(sorted(set(signature.values())))}
        colours = {node: palette[signature[node]] for node in nodes}
        hist = [Counter(c for (g, _), c in colours.items() if g == side) for side in (0, 1)]
        if hist[0] != hist[1]:
            return iteration
    return -1


TRIANGLE = graph(3, [(0, 1), (1, 2), (0, 2)])
PATH_3 = graph(3, [(0, 1), (1, 2)])
CYCLE_6 = graph(6, [(i, (i + 1) % 6) for i in range(6)])
TWO_TRIANGLES = graph(6, [(0, 1), (1, 2), (0, 2), (3, 4), (4, 5), (3, 5)])
# Degree sequences both (1, 1, 2, 2, 2): an edge plus a triangle vs a path on 5 nodes.
EDGE_AND_TRIANGLE = graph(5, [(0, 1), (2, 3), (3, 4), (2, 4)])
PATH_5 = graph(5, [(0, 1), (1, 2), (2, 3), (3, 4)])
# A pair first separated at iteration 3 (found by search, checked by reference_wl).
SCORE_3_A = graph(7, [(0, 4), (0, 6), (1, 2), (1, 5), (1, 6), (3, 5), (4, 6)])
SCORE_3_B = graph(7, [(0, 6), (1, 3), (1, 4), (1, 6), (2, 3), (2, 4), (4, 5)])


@pytest.mark.parametrize(
    ("adj_a", "adj_b", "expected"),
    [
        (TRIANGLE, PATH_3, 1),
        (CYCLE_6, TWO_TRIANGLES, -1),  # both 2-regular: 1-WL cannot tell them apart
        (EDGE_AND_TRIANGLE, PATH_5, 2),
        (SCORE_3_A, SCORE_3_B, 3),
        (TRIANGLE, graph(4, [(0, 1)]), 0),  # different node counts
    ],
)
def test_hand_cases(adj_a, adj_b, expected):
    assert wl_score(adj_a, adj_b) == expected
    assert wl_score(adj_b, adj_a) == expected
    assert reference_wl(adj_a, adj_b, 5) == expected


def test_isomorphic_permuted_graphs_are_never_distinguished():
    rng = np.random.default_rng(0)
    for size in (5, 8, 11):
        for p in (0.2, 0.5, 0.8):
            upper = np.triu(rng.random((size, size)) < p, 1)
            adjacency = (upper | upper.T).astype(np.int8)
            assert wl_score(adjacency, permute(adjacency, rng)) == -1
            assert wl_score(permute(adjacency, rng), permute(adjacency, rng)) == -1


def test_max_iterations_cuts_off_later_differences():
    assert wl_score(SCORE_3_A, SCORE_3_B, max_iterations=2) == -1
    assert wl_score(SCORE_3_A, SCORE_3_B, max_iterations=3) == 3
    assert wl_score(EDGE_AND_TRIANGLE, PATH_5, max_iterations=1) == -1
    with pytest.raises(ValueError, match="max_iterations"):
        wl_score(TRIANGLE, PATH_3, max_iterations=0)


def _swap_pair(rng: np.random.Generator, size: int, p: float) -> tuple[np.ndarray, np.ndarray]:
    """A random graph and a degree-preserving double-edge swap of it (often WL score >= 2)."""
    upper = np.triu(rng.random((size, size)) < p, 1)
    adj = (upper | upper.T).astype(np.int8)
    other = adj.copy()
    edges = np.argwhere(np.triu(other))
    for _ in range(20):
        (a, b), (c, d) = edges[rng.choice(len(edges), 2, replace=False)]
        if len({a, b, c, d}) == 4 and not other[a, d] and not other[c, b]:
            other[a, b] = other[b, a] = other[c, d] = other[d, c] = 0
            other[a, d] = other[d, a] = other[c, b] = other[b, c] = 1
            break
    return adj, other


def test_batched_scores_match_reference_on_random_and_degree_preserving_pairs():
    rng = np.random.default_rng(1)
    size = 9
    pairs = []
    for i in range(240):
        p = (0.2, 0.4, 0.6)[i % 3]
        if i % 2:
            pairs.append(_swap_pair(rng, size, p))
        else:
            upper = rng.random((2, size, size)) < p
            upper = np.triu(upper, 1)
            both = (upper | upper.transpose(0, 2, 1)).astype(np.int8)
            pairs.append((both[0], both[1]))
    adj_a = np.stack([a for a, _ in pairs])
    adj_b = np.stack([b for _, b in pairs])
    scores = wl_scores(adj_a, adj_b, max_iterations=5)
    expected = np.array([reference_wl(a, b, 5) for a, b in pairs], dtype=np.int32)
    np.testing.assert_array_equal(scores, expected)
    assert scores.dtype == np.int32
    # The sample must exercise the general refinement loop, not only iteration 1.
    assert {-1, 1, 2} <= set(expected.tolist())


def test_padding_with_sizes_gives_the_unpadded_scores():
    cases = [
        (TRIANGLE, PATH_3),
        (CYCLE_6, TWO_TRIANGLES),
        (EDGE_AND_TRIANGLE, PATH_5),
        (SCORE_3_A, SCORE_3_B),
        (TRIANGLE, graph(4, [(0, 1)])),
    ]
    n = 9
    adj_a = np.zeros((len(cases), n, n), dtype=np.int8)
    adj_b = np.zeros_like(adj_a)
    for i, (a, b) in enumerate(cases):
        adj_a[i, : len(a), : len(a)] = a
        adj_b[i, : len(b), : len(b)] = b
    sizes_a = np.array([len(a) for a, _ in cases])
    sizes_b = np.array([len(b) for _, b in cases])
    scores = wl_scores(adj_a, adj_b, 5, sizes_a, sizes_b)
    np.testing.assert_array_equal(scores, [1, -1, 2, 3, 0])
    # Without sizes, padding counts as isolated nodes: the triangle/edge pair (3 vs 4
    # real nodes, 9 in all) becomes a same-size pair separated by degrees.
    assert wl_scores(adj_a, adj_b)[4] == 1


def test_torch_input_gives_torch_output():
    a = torch.from_numpy(np.stack([TRIANGLE, PATH_3]))
    b = torch.from_numpy(np.stack([PATH_3, PATH_3[::-1, ::-1].copy()]))
    scores = wl_scores(a, b)
    assert isinstance(scores, torch.Tensor)
    assert scores.dtype == torch.int32
    assert scores.tolist() == [1, -1]


def test_shape_mismatch_is_rejected():
    with pytest.raises(ValueError, match="shape"):
        wl_scores(np.zeros((2, 3, 3)), np.zeros((2, 4, 4)))
    with pytest.raises(ValueError, match="sizes"):
        wl_scores(np.zeros((2, 3, 3)), np.zeros((2, 3, 3)), sizes_a=np.array([4, 1]))


def reference_stable_colours(adj_a: np.ndarray, adj_b: np.ndarray) -> dict[tuple[int, int], int]:
    """Textbook joint colour refinement run until the number of colours stops growing."""
    adjs = (adj_a, adj_b)
    nodes = [(g, v) for g, adj in enumerate(adjs) for v in range(adj.shape[0])]
    colours = {node: 0 for node in nodes}
    while True:
        signature = {(g, v): (colours[(g, v)], tuple(sorted(colours[(g, u)] for u in np.flatnonzero(adjs[g][v]))))
                     for g, v in nodes}
        palette = {sig: i for i, sig in enumerate(sorted(set(signature.values())))}
        refined = {node: palette[signature[node]] for node in nodes}
        if len(set(refined.values())) == len(set(colours.values())):
            return refined
        colours = refined


def test_wl_colours_are_the_stable_joint_refinement_and_padding_is_minus_one():
    rng = np.random.default_rng(5)
    pairs = [(SCORE_3_A, SCORE_3_B), (EDGE_AND_TRIANGLE, PATH_5), (CYCLE_6, TWO_TRIANGLES)]
    pairs += [(a, permute(a, rng)) for a in (SCORE_3_A, PATH_5)]
    pairs += [_swap_pair(rng, 7, 0.5) for _ in range(20)]
    n = 8  # every graph padded to 8 node slots
    adjacency = np.zeros((len(pairs), 2, n, n), dtype=np.int8)
    node_mask = np.zeros((len(pairs), 2, n), dtype=bool)
    for i, pair in enumerate(pairs):
        for g, adj in enumerate(pair):
            adjacency[i, g, : len(adj), : len(adj)] = adj
            node_mask[i, g, : len(adj)] = True
    colours = wl_colours(adjacency, node_mask)
    assert colours.shape == (len(pairs), 2, n) and (colours[~node_mask] == -1).all()
    for i, (adj_a, adj_b) in enumerate(pairs):
        expected = reference_stable_colours(adj_a, adj_b)
        got = {(g, v): int(colours[i, g, v]) for g, v in expected}
        # the same partition of the pair's nodes (colour numbers may differ)
        assert len(set(got.values())) == len(set(expected.values()))
        assert len({(got[node], expected[node]) for node in expected}) == len(set(expected.values()))
    # the path's middle node and a triangle's nodes, both of degree 2, differ after refinement
    assert colours[1, 0, 2] != colours[1, 1, 2]

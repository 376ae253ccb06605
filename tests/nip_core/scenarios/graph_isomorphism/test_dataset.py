"""Tests of the graph-isomorphism dataset: graph helpers, ER sampling, generation,
raw storage, the dataset class, named datasets and the creation script."""

from __future__ import annotations

import importlib.util
import itertools
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from nip_core.scenarios.graph_isomorphism import named_datasets
from nip_core.scenarios.graph_isomorphism.dataset import GraphIsomorphismDataset
from nip_core.scenarios.graph_isomorphism.dataset_generation import (
    DatasetGenerationError,
    GraphIsomorphismDatasetConfig,
    QuotaUnreachableError,
    generate_gi_dataset,
    non_isomorphic_quotas,
)
from nip_core.scenarios.graph_isomorphism.erdos_renyi import BLOCK_GRAPHS, ErdosRenyiSampler
from nip_core.scenarios.graph_isomorphism.graph_utils import dense_to_sparse, to_dense_adj
from nip_core.scenarios.graph_isomorphism.named_datasets import (
    NAMED_DATASETS,
    DatasetConfigMismatchError,
    UnknownDatasetError,
    ensure_named_dataset,
)
from nip_core.scenarios.graph_isomorphism.raw_data import (
    GraphIsomorphismDataError,
    load_raw,
    pairs_to_raw,
    raw_data_path,
    save_raw,
)
from nip_core.scenarios.graph_isomorphism.wl import wl_scores

REPO_ROOT = Path(__file__).resolve().parents[4]

# 4 cells of 10 non-isomorphic pairs: quotas 1 / 2 / 7; 20 isomorphic pairs copied from
# them and 20 fresh ones (5 per cell).
SMALL = GraphIsomorphismDatasetConfig(
    num_samples=80, graph_sizes=[7, 8], edge_probabilities=[0.4, 0.6], seed=11
)


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def small_pairs():
    return generate_gi_dataset(SMALL)


def random_adjacency(rng, num_graphs, size, p, sizes=None):
    upper = np.triu(rng.random((num_graphs, size, size)) < p, 1)
    adjacency = (upper | upper.transpose(0, 2, 1)).astype(np.int8)
    if sizes is not None:
        mask = np.arange(size)[None, :] < np.asarray(sizes)[:, None]
        adjacency &= (mask[:, :, None] & mask[:, None, :]).astype(np.int8)
    return adjacency


_PERMUTATIONS: dict[int, np.ndarray] = {}


def isomorphic(adj_a: np.ndarray, adj_b: np.ndarray) -> bool:
    """Brute force over all node permutations (fine up to 8 nodes)."""
    n = adj_a.shape[0]
    if n not in _PERMUTATIONS:
        _PERMUTATIONS[n] = np.array(list(itertools.permutations(range(n))))
    perms = _PERMUTATIONS[n]
    permuted = adj_b[perms[:, :, None], perms[:, None, :]]
    return bool((permuted == adj_a).all(axis=(1, 2)).any())


# ---------------------------------------------------------------- graph helpers


def test_dense_sparse_round_trip_with_padding_and_empty_graphs():
    rng = np.random.default_rng(0)
    sizes = np.array([5, 7, 3, 7, 1, 6])
    adjacency = random_adjacency(rng, len(sizes), 7, 0.5, sizes)
    adjacency[-1] = 0  # a trailing graph without edges must still get its slice
    edge_index, slices = dense_to_sparse(torch.from_numpy(adjacency))
    assert edge_index.dtype == torch.int64 and slices.dtype == torch.int64
    assert slices.tolist() == [0, *np.cumsum(adjacency.sum(axis=(1, 2))).tolist()]
    assert slices[-1] == slices[-2]
    dense = to_dense_adj(edge_index, slices, torch.from_numpy(sizes), 9)
    assert dense.dtype == torch.int32 and dense.shape == (6, 9, 9)
    np.testing.assert_array_equal(dense[:, :7, :7].numpy(), adjacency)
    assert not dense[:, 7:].any() and not dense[:, :, 7:].any()


def test_dense_to_sparse_is_sorted_local_and_bidirectional():
    adjacency = torch.zeros(2, 3, 3, dtype=torch.int32)
    adjacency[0, 0, 2] = adjacency[0, 2, 0] = 1
    adjacency[1, 1, 2] = adjacency[1, 2, 1] = 1
    adjacency[1, 0, 1] = adjacency[1, 1, 0] = 1
    edge_index, slices = dense_to_sparse(adjacency)
    assert edge_index.tolist() == [[0, 2, 0, 1, 1, 2], [2, 0, 1, 0, 2, 1]]
    assert slices.tolist() == [0, 2, 6]


def test_to_dense_adj_rejects_out_of_range_and_inconsistent_input():
    edge_index = torch.tensor([[0, 3], [3, 0]])
    with pytest.raises(ValueError, match="out of range"):
        to_dense_adj(edge_index, torch.tensor([0, 2]), torch.tensor([3]), 4)
    with pytest.raises(ValueError, match="slices"):
        to_dense_adj(edge_index, torch.tensor([0, 1]), torch.tensor([4]), 4)
    with pytest.raises(ValueError, match="max_nodes"):
        to_dense_adj(edge_index, torch.tensor([0, 2]), torch.tensor([4]), 3)


# ---------------------------------------------------------------- ER sampling


def _sampler(size, p, seed=0):
    streams = [np.random.SeedSequence(seed, spawn_key=(i,)) for i in range(4)]
    return ErdosRenyiSampler(size, p, streams)


@pytest.mark.parametrize("size", [7, 13])  # 13 nodes: 78 edges span two words
def test_er_sampler_is_chunking_independent_and_consistent(size):
    whole = _sampler(size, 0.3).sample_blocks(3)
    pieces = _sampler(size, 0.3)
    np.testing.assert_array_equal(
        whole, np.concatenate([pieces.sample_blocks(1), pieces.sample_blocks(2)])
    )
    sampler = _sampler(size, 0.3)
    adjacency = sampler.to_adjacency(whole)
    assert adjacency.shape == (3 * BLOCK_GRAPHS, size, size)
    assert (adjacency == adjacency.transpose(0, 2, 1)).all()
    assert not adjacency[:, np.arange(size), np.arange(size)].any()
    np.testing.assert_array_equal(sampler.degrees(whole), adjacency.sum(axis=2))
    np.testing.assert_array_equal(sampler.edge_counts(whole), adjacency.sum(axis=(1, 2)) // 2)
    # Unused high bits of the last word stay clear.
    assert not (whole[:, -1] & ~sampler.lane_mask[-1]).any()


@pytest.mark.parametrize("p", [0.2, 0.6, 0.8])
def test_er_sampler_edge_frequency(p):
    sampler = _sampler(11, p, seed=3)
    words = sampler.sample_blocks(8)
    frequency = sampler.edge_counts(words).sum() / (len(words) * sampler.num_slots)
    # 450k Bernoulli draws: standard error below 0.001.
    assert abs(frequency - p) < 0.004


def test_er_sampler_extreme_probabilities():
    assert not _sampler(6, 0.0).sample_blocks(1).any()
    full = _sampler(6, 1.0).to_adjacency(_sampler(6, 1.0).sample_blocks(1))
    assert (full.sum(axis=(1, 2)) == 30).all()


# ---------------------------------------------------------------- generation


def test_quotas_are_met_exactly_per_cell(small_pairs):
    assert non_isomorphic_quotas(SMALL) == (1, 2, 7)
    scores, sizes = small_pairs.wl_scores, small_pairs.sizes
    assert scores.shape == (80,) and scores.dtype == np.int32
    assert small_pairs.adjacency.shape == (80, 2, 8, 8)
    non_iso = scores[:40].reshape(4, 10)  # cells (7, .4), (7, .6), (8, .4), (8, .6)
    for cell in non_iso:
        assert (cell == 1).sum() == 1 and (cell == 2).sum() == 2 and (cell > 2).sum() == 7
    assert (scores[40:] == -1).all()
    np.testing.assert_array_equal(sizes[:40], [7] * 20 + [8] * 20)
    np.testing.assert_array_equal(sizes[60:], [7] * 10 + [8] * 10)  # fresh: 5 per cell


def test_stored_scores_are_the_wl_scores(small_pairs):
    adjacency, sizes = small_pairs.adjacency, small_pairs.sizes
    recomputed = wl_scores(adjacency[:, 0], adjacency[:, 1], 5, sizes, sizes)
    np.testing.assert_array_equal(recomputed, small_pairs.wl_scores)
    # Padding beyond each graph's size is empty.
    mask = np.arange(8)[None, :] < sizes[:, None]
    real = np.broadcast_to(mask[:, None, :, None] & mask[:, None, None, :], adjacency.shape)
    assert not adjacency[~real].any()


def test_isomorphic_pairs_are_isomorphic_and_independently_permuted(small_pairs):
    adjacency, sizes = small_pairs.adjacency, small_pairs.sizes
    identical = 0
    for i in range(40, 80):
        n = sizes[i]
        a, b = adjacency[i, 0, :n, :n], adjacency[i, 1, :n, :n]
        assert isomorphic(a, b), f"pair {i} is not isomorphic"
        identical += int((a == b).all())
    assert identical < 10
    # Pairs 40..59 copy a graph of some non-isomorphic pair of the same size (WL finds
    # the candidates, brute force confirms one).
    non_iso_graphs = adjacency[:40].reshape(80, 8, 8)
    non_iso_sizes = np.repeat(sizes[:40], 2)
    for i in range(40, 60):
        n = sizes[i]
        copies = np.repeat(adjacency[i, 0][None], 80, axis=0)
        equivalent = wl_scores(copies, non_iso_graphs, 5, np.full(80, n), non_iso_sizes) == -1
        assert any(
            isomorphic(adjacency[i, 0, :n, :n], non_iso_graphs[j, :n, :n])
            for j in np.flatnonzero(equivalent)
        )


def test_output_does_not_depend_on_batch_size():
    config = SMALL.model_copy(update={"num_samples": 40})
    reference = generate_gi_dataset(config)
    chunked = generate_gi_dataset(config, batch_size=1)
    np.testing.assert_array_equal(reference.adjacency, chunked.adjacency)
    np.testing.assert_array_equal(reference.wl_scores, chunked.wl_scores)


@pytest.mark.slow
def test_output_does_not_depend_on_num_workers():
    config = SMALL.model_copy(update={"num_samples": 40})
    reference = generate_gi_dataset(config)
    parallel = generate_gi_dataset(config, num_workers=2)
    np.testing.assert_array_equal(reference.adjacency, parallel.adjacency)


@pytest.mark.slow
@pytest.mark.parametrize("threshold_s, in_processes", [(0.0, True), (1e9, False)])
def test_auto_workers_move_the_other_cells_to_processes_only_when_worth_it(monkeypatch, threshold_s, in_processes):
    from nip_core.scenarios.graph_isomorphism import dataset_generation

    config = SMALL.model_copy(update={"num_samples": 40})
    reference = generate_gi_dataset(config)
    batches = []
    real = dataset_generation._sample_cells_in_processes
    monkeypatch.setattr(dataset_generation, "_sample_cells_in_processes",
                        lambda jobs, workers: batches.append((len(jobs), workers)) or real(jobs, workers))
    monkeypatch.setattr(dataset_generation, "AUTO_PARALLEL_MIN_S", threshold_s)
    monkeypatch.setattr(dataset_generation, "_usable_cores", lambda: 2)
    auto = generate_gi_dataset(config, num_workers=None)
    assert batches == ([(len(config.cells) - 1, 2)] if in_processes else [])
    np.testing.assert_array_equal(reference.adjacency, auto.adjacency)
    np.testing.assert_array_equal(reference.wl_scores, auto.wl_scores)


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path):
    def write(config, path):
        pairs = generate_gi_dataset(config)
        raw = pairs_to_raw(pairs.adjacency, pairs.sizes, pairs.wl_scores, config.model_dump())
        save_raw(raw, path)
        return path.read_bytes()

    first = write(SMALL, tmp_path / "one" / "data.pt")
    second = write(SMALL, tmp_path / "two" / "other_name.pt")
    assert first == second
    assert write(SMALL.model_copy(update={"seed": 12}), tmp_path / "three" / "data.pt") != first
    assert [p.name for p in (tmp_path / "one").iterdir()] == ["data.pt"]  # no temp files left


def test_unreachable_quotas_fail_fast_with_the_cell_named():
    with pytest.raises(QuotaUnreachableError, match=r"size=7, p=0.4.*max_iterations=1"):
        generate_gi_dataset(SMALL.model_copy(update={"max_iterations": 1}))
    with pytest.raises(QuotaUnreachableError, match=r"p=1.0"):
        generate_gi_dataset(SMALL.model_copy(update={"edge_probabilities": [1.0]}))
    with pytest.raises(QuotaUnreachableError, match=r"size=7, p=0.4.*after 1024 candidate"):
        generate_gi_dataset(SMALL, max_candidates_per_cell=1000)


def test_isomorphic_copies_need_non_isomorphic_pairs():
    no_non_iso = SMALL.model_copy(update={"prop_non_isomorphic": 0.0})
    with pytest.raises(DatasetGenerationError, match="isomorphic pairs should be copied"):
        generate_gi_dataset(no_non_iso)
    only_fresh = generate_gi_dataset(no_non_iso.model_copy(update={"iso_prop_from_non_iso": 0.0}))
    assert (only_fresh.wl_scores == -1).all() and len(only_fresh.wl_scores) == 80


def test_config_validation():
    with pytest.raises(ValidationError, match="must not exceed 1"):
        GraphIsomorphismDatasetConfig(
            num_samples=10, non_iso_prop_score_1=0.6, non_iso_prop_score_2=0.5
        )
    with pytest.raises(ValidationError):
        GraphIsomorphismDatasetConfig(num_samples=10, edge_probabilities=[1.5])
    with pytest.raises(ValidationError):
        GraphIsomorphismDatasetConfig(num_samples=10, unknown_field=1)


# ---------------------------------------------------------------- raw files and dataset


def write_original_file(path: Path) -> None:
    """A file as the original library wrote it: no config, shared sizes tensor."""
    sizes = torch.tensor([3, 4, 2], dtype=torch.int32)
    data = dict(
        # pair 0: triangle vs path; pair 1: one edge each; pair 2: two isolated nodes
        edge_index_a=torch.tensor([[0, 1, 0, 2, 1, 2, 0, 3], [1, 0, 2, 0, 2, 1, 3, 0]]),
        edge_index_b=torch.tensor([[0, 1, 1, 2, 1, 2], [1, 0, 2, 1, 2, 1]]),
        slices_a=torch.tensor([0, 6, 8, 8]),
        slices_b=torch.tensor([0, 4, 6, 6]),
        wl_scores=torch.tensor([1, -1, -1], dtype=torch.int32),
        sizes_a=sizes,
        sizes_b=sizes,
    )
    path.parent.mkdir(parents=True)
    torch.save(data, path)


def test_loads_a_file_in_the_original_format(tmp_path):
    path = raw_data_path(tmp_path, "orig", "train")
    write_original_file(path)
    dataset = GraphIsomorphismDataset.from_path(path)
    assert len(dataset) == 3 and dataset.max_nodes == 4 and dataset.config is None
    td = dataset.tensordict
    assert td["adjacency"].dtype == torch.int32 and td["adjacency"].shape == (3, 2, 4, 4)
    triangle = torch.tensor([[0, 1, 1, 0], [1, 0, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]])
    path_3 = torch.tensor([[0, 1, 0, 0], [1, 0, 1, 0], [0, 1, 0, 0], [0, 0, 0, 0]])
    assert torch.equal(td["adjacency"][0, 0], triangle.int())
    assert torch.equal(td["adjacency"][0, 1], path_3.int())
    assert td["adjacency"][1, 0].nonzero().tolist() == [[0, 3], [3, 0]]
    assert td["adjacency"][1, 1].nonzero().tolist() == [[1, 2], [2, 1]]
    assert not td["adjacency"][2].any()
    assert td["node_mask"].tolist() == [
        [[True, True, True, False]] * 2,
        [[True] * 4] * 2,
        [[True, True, False, False]] * 2,
    ]
    assert td["y"].tolist() == [0, 1, 1] and td["y"].dtype == torch.int64
    assert td["wl_score"].tolist() == [1, -1, -1]
    assert td["id"].tolist() == [0, 1, 2]
    assert td["sizes"].tolist() == [[3, 3], [4, 4], [2, 2]]
    # Indexing: an int gives a single pair, a slice or index tensor a sub-batch.
    assert dataset[1].batch_size == torch.Size([]) and int(dataset[1]["y"]) == 1
    assert dataset[1:].batch_size == torch.Size([2])
    assert dataset[torch.tensor([2, 0])]["id"].tolist() == [2, 0]
    # An unregistered name whose file exists loads from the cache directory.
    assert len(GraphIsomorphismDataset.from_name("orig", "train", data_dir=tmp_path)) == 3


def _mutations():
    yield "missing key", lambda d: d.pop("slices_b"), "missing keys"
    yield "short slices", lambda d: d.update(slices_a=d["slices_a"][:-1]), "slices_a"
    yield "bad edge", lambda d: d["edge_index_a"].__setitem__((0, 0), 7), "out of range"
    yield "float scores", lambda d: d.update(wl_scores=d["wl_scores"].float()), "integer dtype"
    yield "sizes shape", lambda d: d.update(sizes_b=d["sizes_b"][:2].clone()), "sizes_b"
    yield "config type", lambda d: d.update(config=[1, 2]), "config"


@pytest.mark.parametrize(("label", "mutate", "message"), list(_mutations()))
def test_malformed_files_raise_an_error_naming_the_file(tmp_path, label, mutate, message):
    path = tmp_path / "bad" / "data.pt"
    write_original_file(path)
    data = torch.load(path, weights_only=True)
    data["sizes_b"] = data["sizes_b"].clone()
    mutate(data)
    torch.save(data, path)
    with pytest.raises(GraphIsomorphismDataError, match=message) as info:
        GraphIsomorphismDataset.from_path(path)
    assert str(path) in str(info.value)


def test_unreadable_and_missing_files(tmp_path):
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a torch file")
    with pytest.raises(GraphIsomorphismDataError, match="torch.load") as info:
        load_raw(garbage)
    assert str(garbage) in str(info.value)
    with pytest.raises(GraphIsomorphismDataError, match="does not exist"):
        load_raw(tmp_path / "absent.pt")
    listed = tmp_path / "list.pt"
    torch.save([1, 2], listed)
    with pytest.raises(GraphIsomorphismDataError, match="expected a dict"):
        load_raw(listed)


def test_generated_file_round_trips_through_the_dataset(tmp_path, small_pairs):
    path = tmp_path / "data.pt"
    pairs = small_pairs
    save_raw(pairs_to_raw(pairs.adjacency, pairs.sizes, pairs.wl_scores, SMALL.model_dump()), path)
    raw = load_raw(path)
    assert raw["edge_index_a"].dtype == torch.int64 and raw["slices_a"].shape == (81,)
    assert raw["sizes_a"].dtype == torch.int32 and raw["wl_scores"].dtype == torch.int32
    dataset = GraphIsomorphismDataset.from_path(path)
    assert dataset.config == SMALL
    np.testing.assert_array_equal(dataset.tensordict["adjacency"].numpy(), small_pairs.adjacency)
    assert dataset.tensordict["y"].sum() == 40
    subset = GraphIsomorphismDataset.from_path(path, max_size=30)
    ids = subset.tensordict["id"]
    assert len(subset) == 30 and torch.equal(ids, ids.sort().values) and len(ids.unique()) == 30
    assert torch.equal(GraphIsomorphismDataset.from_path(path, max_size=30).tensordict["id"], ids)
    assert 0 < int(subset.tensordict["y"].sum()) < 30  # not just the leading non-iso pairs


# ---------------------------------------------------------------- named datasets


def test_named_test_dataset_is_generated_once_and_cached(tmp_path, monkeypatch):
    calls = []
    real = named_datasets.generate_to_file

    def counting(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(named_datasets, "generate_to_file", counting)
    results = []
    def first_use():
        results.append(ensure_named_dataset("test", "train", data_dir=tmp_path))

    threads = [threading.Thread(target=first_use) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1 and len(set(results)) == 1

    dataset = GraphIsomorphismDataset.from_name("test", "train", data_dir=tmp_path)
    assert len(calls) == 1
    assert len(dataset) == 100 and dataset.max_nodes == 8
    assert dataset.config == NAMED_DATASETS["test"]["train"]
    scores = dataset.tensordict["wl_score"]
    assert [(scores == s).sum().item() for s in (-1, 1, 2)] == [50, 4, 10]
    assert (scores > 2).sum() == 36


def test_named_dataset_errors(tmp_path, monkeypatch):
    with pytest.raises(UnknownDatasetError, match="unknown graph-isomorphism dataset 'nope'"):
        GraphIsomorphismDataset.from_name("nope", "train", data_dir=tmp_path)
    with pytest.raises(UnknownDatasetError, match="no split 'validation'"):
        GraphIsomorphismDataset.from_name("test", "validation", data_dir=tmp_path)
    # A cached file generated from another config is refused, naming the file.
    other = NAMED_DATASETS["test"]["test"]
    path = raw_data_path(tmp_path, "test", "train")
    named_datasets.generate_to_file(other, path)
    with pytest.raises(DatasetConfigMismatchError, match="delete the file") as info:
        GraphIsomorphismDataset.from_name("test", "train", data_dir=tmp_path)
    assert str(path) in str(info.value)
    # The data directory defaults to $NIPFLOW_DATA_DIR.
    monkeypatch.setenv("NIPFLOW_DATA_DIR", str(tmp_path))
    assert ensure_named_dataset("test", "train") == path


def test_registered_splits_use_different_seeds():
    for name, splits in NAMED_DATASETS.items():
        seeds = [config.seed for config in splits.values()]
        assert len(set(seeds)) == len(seeds), name
    assert NAMED_DATASETS["er10000"]["train"].num_samples == 10_000
    assert NAMED_DATASETS["er10000"]["train"].seed != NAMED_DATASETS["eru10000"]["train"].seed


# ---------------------------------------------------------------- script


def test_create_script(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location(
        "create_gi_dataset", REPO_ROOT / "scripts" / "create_gi_dataset.py"
    )
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    argv = ["demo", "--num-pairs", "40", "--seed", "5", "--data-dir", str(tmp_path),
            "--graph-sizes", "7", "8", "--edge-probabilities", "0.5"]
    assert script.main(argv) == 0
    path = raw_data_path(tmp_path, "demo", "train")
    dataset = GraphIsomorphismDataset.from_path(path)
    assert dataset.config == GraphIsomorphismDatasetConfig(
        num_samples=40, seed=5, graph_sizes=[7, 8], edge_probabilities=[0.5]
    )
    before = path.read_bytes()
    assert script.main(argv) == 1  # refuses to overwrite
    assert "exists" in capsys.readouterr().err
    assert script.main([*argv, "--overwrite", "--split", "test"]) == 0
    assert raw_data_path(tmp_path, "demo", "test").read_bytes() == before


@pytest.mark.parametrize("name", ["../../outside", "/abs", "a/b", "..", ".hidden", ""])
def test_a_dataset_name_that_is_a_path_is_refused_before_anything_is_read(tmp_path, name):
    # the name is a directory under data_dir/graph_isomorphism: '../../outside' read the file
    # planted in tmp_path/outside (a weights-only torch.load, but still a file outside data_dir)
    data_dir = tmp_path / "data"
    escaped = tmp_path / "outside" / "raw" / "train" / "data.pt"
    escaped.parent.mkdir(parents=True)
    escaped.write_bytes(b"planted")
    with pytest.raises(named_datasets.UnknownDatasetError, match="is one path component"):
        GraphIsomorphismDataset.from_name(name, "train", data_dir=data_dir)
    assert not data_dir.exists()  # nothing created either

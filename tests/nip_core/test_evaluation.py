"""Evaluating a run's final checkpoint on a dataset file; the original format's writer and reader."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from torch import nn

from nip_core.errors import RunNotFoundError
from nip_core.evaluation import EvaluationError, evaluate_run, format_evaluation, load_agents_state
from nip_core.parameters import HyperParameters
from nip_core.runs import RunStore
from nip_core.scenarios.graph_isomorphism.original_format import (
    read_dataset_file,
    read_raw_file,
    write_original_format,
)
from nip_core.scenarios.graph_isomorphism.raw_data import RAW_KEYS, GraphIsomorphismDataError, load_raw
from tests.nip_core.evaluation_helpers import (
    BIG_MAX_NODES,
    NUM_BIG_PAIRS,
    TRAIN_MAX_NODES,
    graph_pairs,
    train_tiny_run,
    write_files,
)


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every test here on one torch thread (the shared fixture of tests/conftest.py)."""


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A vanilla_ppo run trained for 2 iterations on graphs of at most 6 nodes, and its files."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("eval")
    files = write_files(root / "files")
    try:
        train_tiny_run(root / "runs", files, run_id="gi")
    finally:
        torch.set_num_threads(previous)
    return root / "runs", files


def edge_sets(data, label):
    """Per graph, the set of directed edges of ``edge_index_{label}``."""
    edges, slices = data[f"edge_index_{label}"], data[f"slices_{label}"]
    return [{(int(edges[0, k]), int(edges[1, k])) for k in range(int(slices[i]), int(slices[i + 1]))}
            for i in range(slices.shape[0] - 1)]


def dense_edge_sets(adjacency, column):
    return [{(int(i), int(j)) for i, j in zip(*np.nonzero(adjacency[g, column]))} for g in range(adjacency.shape[0])]


# -- writer and reader ---------------------------------------------------------------------------


def test_writer_reader_round_trip_is_exact(tmp_path):
    adjacency, sizes, scores = graph_pairs(9, 3, 7, seed=5)
    adjacency[4, 1] = 0  # an edgeless graph in the middle of column b
    path = write_original_format(tmp_path / "raw" / "data.pt", adjacency, sizes, scores)
    data = load_raw(path)
    assert set(data) == set(RAW_KEYS)  # exactly the original keys: no config
    assert data["edge_index_a"].dtype == torch.int64 and data["slices_b"].dtype == torch.int64
    assert data["wl_scores"].dtype == torch.int32 and data["sizes_a"].dtype == torch.int32
    for column, label in enumerate("ab"):
        assert edge_sets(data, label) == dense_edge_sets(adjacency, column)
        assert data[f"sizes_{label}"].tolist() == sizes.tolist()
    assert edge_sets(data, "b")[4] == set()
    assert data["wl_scores"].tolist() == scores.tolist()

    dataset = read_dataset_file(path)
    assert dataset.max_nodes == int(sizes.max())
    m = int(sizes.max())
    assert torch.equal(dataset.tensordict["adjacency"], torch.as_tensor(adjacency[..., :m, :m], dtype=torch.int32))
    assert dataset.tensordict["y"].tolist() == [int(s == -1) for s in scores]
    # Writing the dataset back gives the same bytes (deterministic writer, lossless reader).
    again = write_original_format(tmp_path / "again.pt", dataset=dataset)
    assert again.read_bytes() == path.read_bytes()


def test_reader_accepts_slices_cut_by_the_original_converter(tmp_path):
    adjacency, sizes, scores = graph_pairs(6, 4, 5, seed=3)
    adjacency[4:, 0] = 0  # the last two graphs of column a have no edges
    whole = write_original_format(tmp_path / "whole.pt", adjacency, sizes, scores)
    cut = write_original_format(tmp_path / "cut.pt", adjacency, sizes, scores, drop_trailing_empty_slices=True)
    raw = torch.load(cut, weights_only=True)
    assert raw["slices_a"].shape == (5,) and raw["slices_b"].shape == (7,)
    with pytest.raises(GraphIsomorphismDataError, match="slices_a"):
        load_raw(cut)
    padded = read_raw_file(cut)
    assert torch.equal(padded["slices_a"], load_raw(whole)["slices_a"])
    assert torch.equal(read_dataset_file(cut).tensordict["adjacency"],
                       read_dataset_file(whole).tensordict["adjacency"])


def test_reader_names_the_file_and_the_missing_key(tmp_path):
    path = write_original_format(tmp_path / "d.pt", *graph_pairs(4, 3, 4, seed=0))
    data = load_raw(path)
    del data["sizes_b"]
    torch.save(data, tmp_path / "bad.pt")
    with pytest.raises(GraphIsomorphismDataError, match=r"bad\.pt.*'sizes_b'"):
        read_dataset_file(tmp_path / "bad.pt")
    with pytest.raises(GraphIsomorphismDataError, match="does not exist"):
        read_dataset_file(tmp_path / "nope.pt")


# -- loading weights into a rebuilt scenario -----------------------------------------------------


class _Toy(nn.Module):
    def __init__(self, nodes: int, width: int = 3):
        super().__init__()
        self.linear = nn.Linear(width, 2)
        self.register_buffer("mask", torch.ones(nodes, nodes))


def test_load_agents_state_keeps_rebuilt_buffers_and_refuses_learned_shapes():
    small, big = _Toy(nodes=4), _Toy(nodes=9)
    assert load_agents_state(big, small.state_dict(), source="ckpt") == ["mask"]
    assert torch.equal(big.linear.weight, small.linear.weight)
    assert big.mask.shape == (9, 9)
    with pytest.raises(EvaluationError, match=r"ckpt: .*linear\.weight \(2, 5\) -> \(2, 3\)"):
        load_agents_state(_Toy(nodes=4), _Toy(nodes=4, width=5).state_dict(), source="ckpt")
    with pytest.raises(EvaluationError, match=r"missing tensors \['linear\.bias'\]"):
        load_agents_state(_Toy(nodes=4), {k: v for k, v in small.state_dict().items() if k != "linear.bias"},
                          source="ckpt")


# -- evaluate_run ----------------------------------------------------------------------------------


def test_evaluate_larger_graphs_every_pair_once(trained):
    runs_dir, files = trained
    result = evaluate_run("gi", files["big"], runs_dir=str(runs_dir))
    assert result["max_nodes"] == BIG_MAX_NODES > TRAIN_MAX_NODES
    assert result["checkpoint"] == "iter_000002" and result["iteration"] == 2
    assert result["n"] == result["num_pairs"] == NUM_BIG_PAIRS
    assert result["stats"]["test_num_episodes"] == NUM_BIG_PAIRS
    assert result["test_accuracy"] == result["stats"]["test_mean_accuracy"]
    # Per WL score: the file's own score counts, and accuracies that add up to the total.
    by_score = result["accuracy_by_wl_score"]
    expected_counts = Counter(str(s) for s in load_raw(files["big"])["wl_scores"].tolist())
    assert {score: count for score, (_, count) in by_score.items()} == expected_counts
    correct = sum(round(accuracy * count) for accuracy, count in by_score.values())
    assert result["test_accuracy"] == correct / NUM_BIG_PAIRS
    assert {"verifier.test_mean_episode_reward", "prover.test_mean_episode_reward",
            "test_mean_episode_length", "test_decision_rate"} <= set(result["stats"])
    # Deterministic: the same file gives the same figures.
    assert evaluate_run("gi", files["big"], runs_dir=str(runs_dir)) == result
    lines = format_evaluation(result).splitlines()
    assert lines[-1] == f"test_accuracy={result['test_accuracy']} n={NUM_BIG_PAIRS}"


def test_test_loop_mode_reproduces_the_runs_own_test(trained):
    runs_dir, files = trained
    run = RunStore(str(runs_dir)).open_run("gi")
    (own,) = [row for row in run.read_metrics() if row["kind"] == "test"]
    result = evaluate_run("gi", files["test"], runs_dir=str(runs_dir), mode="test_loop")
    assert result["stats"] == {k: v for k, v in own.items() if k not in ("iteration", "kind")}
    assert result["n"] == int(own["test_num_episodes"])
    assert result["test_accuracy"] == own["test_mean_accuracy"]
    # The test loop also runs on larger graphs; n counts its finished episodes.
    bigger = evaluate_run("gi", files["big"], runs_dir=str(runs_dir), mode="test_loop")
    assert bigger["max_nodes"] == BIG_MAX_NODES and bigger["n"] == bigger["stats"]["test_num_episodes"] > 0


def test_evaluate_solo_agent_run(tmp_path):
    files = write_files(tmp_path / "files")
    hp = train_tiny_run(tmp_path / "runs", files, run_id="solo", trainer="solo_agent")
    result = evaluate_run("solo", files["big"], runs_dir=str(tmp_path / "runs"))
    assert result["checkpoint"] == "iter_000002"
    assert result["n"] == NUM_BIG_PAIRS
    assert set(result["stats"]) == {"prover.test_loss", "prover.test_accuracy", "verifier.test_loss",
                                    "verifier.test_accuracy"}
    assert result["test_accuracy"] == result["stats"]["verifier.test_accuracy"]
    correct = result["test_accuracy"] * NUM_BIG_PAIRS  # a whole number of pairs
    assert abs(correct - round(correct)) < 1e-5
    held_out = evaluate_run("solo", files["big"], runs_dir=str(tmp_path / "runs"), mode="test_loop")
    assert held_out["n"] == max(1, round(NUM_BIG_PAIRS * hp.test_size)) < NUM_BIG_PAIRS


def test_evaluate_errors_name_the_run_or_file(trained, tmp_path):
    runs_dir, files = trained
    with pytest.raises(RunNotFoundError, match="'nope'"):
        evaluate_run("nope", files["big"], runs_dir=str(runs_dir))
    with pytest.raises(EvaluationError, match=r"missing\.pt: raw data file does not exist"):
        evaluate_run("gi", tmp_path / "missing.pt", runs_dir=str(runs_dir))
    data = load_raw(files["big"])
    del data["slices_b"]
    torch.save(data, tmp_path / "bad.pt")
    with pytest.raises(EvaluationError, match=r"bad\.pt: missing keys \['slices_b'\]"):
        evaluate_run("gi", tmp_path / "bad.pt", runs_dir=str(runs_dir))
    with pytest.raises(EvaluationError, match="unknown evaluation mode 'all'"):
        evaluate_run("gi", files["big"], runs_dir=str(runs_dir), mode="all")

    store = RunStore(str(runs_dir))
    store.open_run("untrained", RunStore(str(runs_dir)).load_params("gi"))
    with pytest.raises(EvaluationError, match="run 'untrained' has no checkpoint"):
        evaluate_run("untrained", files["big"], runs_dir=str(runs_dir))
    text = HyperParameters.from_dict({"scenario": "code_validation", "trainer": "pure_text_ei",
                                      "dataset": "nipflow-cv"})
    store.open_run("text", text)
    with pytest.raises(EvaluationError, match="run 'text' is a code_validation run"):
        evaluate_run("text", files["big"], runs_dir=str(runs_dir))


def test_transcripts_follow_the_protocol_and_the_file_and_are_drawn(trained, tmp_path):
    from nip_core.scenarios.graph_isomorphism.transcripts import format_transcript, render_transcript

    runs_dir, files = trained
    result = evaluate_run("gi", files["big"], runs_dir=str(runs_dir), transcripts=2)
    data = read_dataset_file(files["big"]).tensordict
    labels = data["y"].tolist()
    transcripts = result["transcripts"]
    scores = data["wl_score"].tolist()
    # the first two isomorphic pairs, then the first two non-isomorphic ones of each WL score
    # (ascending, -1 last), by datapoint id
    non_iso_scores = sorted({s for s, y in zip(scores, labels) if y == 0}, key=lambda s: (s < 0, s))
    expected = [i for i, y in enumerate(labels) if y == 1][:2]
    for score in non_iso_scores:
        expected += [i for i, (s, y) in enumerate(zip(scores, labels)) if y == 0 and s == score][:2]
    assert len(non_iso_scores) >= 2 and [t["pair"] for t in transcripts] == expected
    for t in transcripts:
        pair = t["pair"]
        assert t["y"] == labels[pair] and t["wl_score"] == int(data["wl_score"][pair])
        for g, graph in enumerate(t["graphs"]):
            adjacency = data["adjacency"][pair, g]
            assert graph["nodes"] == int(data["node_mask"][pair, g].sum())
            assert sorted(graph["edges"]) == [tuple(e) for e in torch.triu(adjacency, 1).nonzero().tolist()]
        # nip, verifier first: the verifier in even rounds, the prover in odd ones, one message a
        # round from round 0 on, each node a real one; a prover answers in the other graph
        messages = t["messages"]
        assert [m["round"] for m in messages] == list(range(len(messages))) and messages
        assert [m["agent"] for m in messages] == ["verifier" if r % 2 == 0 else "prover" for r in range(len(messages))]
        for previous, m in zip([None, *messages], messages):
            assert m["node"] < t["graphs"][m["graph"]]["nodes"]
            if m["agent"] == "prover":
                assert m["graph"] != previous["graph"]
        assert t["correct"] == (t["decision"] == t["y"]) and t["decision"] in (0, 1, None)
    lines = format_evaluation(result).splitlines()
    shown = lines[-1 - len(transcripts):-1]
    assert [format_transcript(t) for t in transcripts] == [line.strip() for line in shown]
    assert shown[0].startswith("    pair ") and " -> " in shown[0]
    render_transcript(transcripts[0], tmp_path / "pair.png")
    assert (tmp_path / "pair.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # without transcripts the result has none; they need the pairs mode
    assert "transcripts" not in evaluate_run("gi", files["big"], runs_dir=str(runs_dir))
    with pytest.raises(EvaluationError, match="transcripts: 2 pairs per class; transcripts need .* mode 'pairs'"):
        evaluate_run("gi", files["big"], runs_dir=str(runs_dir), mode="test_loop", transcripts=2)

"""Sweep variants on a further held-out file: groups, differences, accuracy by WL score, plot, card row."""

from __future__ import annotations

import math

import pytest

from nip_core.logging.held_out import (
    accuracy_by_wl_score,
    file_label,
    held_out_card_row,
    held_out_groups,
    held_out_section,
    plot_by_wl_score,
)


def result(run_id, accuracy, by_score=None, n=200):
    out = {"run_id": run_id, "test_accuracy": accuracy, "n": n, "num_pairs": n, "max_nodes": 11}
    if by_score is not None:
        out["accuracy_by_wl_score"] = by_score
    return out


RESULTS = [
    ("nip", 2, result("s-000", 0.70, {"-1": [0.90, 100], "1": [1.0, 20], "3": [0.30, 80]})),
    ("nip", 1, result("s-001", 0.60, {"-1": [0.80, 100], "1": [0.95, 20], "3": [0.20, 80]})),
    ("solo", 1, result("s-002", 0.55, {"-1": [0.95, 100], "1": [1.0, 20], "3": [0.0, 80]})),
    ("solo", 2, result("s-003", 0.58, {"-1": [0.97, 100], "1": [0.90, 20], "3": [0.05, 80]})),
]


def test_groups_keep_the_first_seen_order_with_seeds_and_binomial_standard_errors():
    nip, solo = held_out_groups(RESULTS)
    assert (nip.label, nip.counted, nip.seeds, nip.accuracies) == ("nip", ["s-000", "s-001"], [2, 1], [0.70, 0.60])
    assert solo.run_ids == ["s-002", "s-003"] and solo.sources == ["test", "test"]
    assert nip.standard_errors == pytest.approx([math.sqrt(0.7 * 0.3 / 200), math.sqrt(0.6 * 0.4 / 200)], rel=1e-12)
    assert nip.mean == pytest.approx(0.65) and nip.std == pytest.approx(math.sqrt(0.005))


def test_accuracy_by_wl_score_is_the_mean_over_each_variants_runs_with_the_files_counts():
    scores, counts, means = accuracy_by_wl_score(RESULTS)
    assert scores == ["-1", "1", "3"] and counts == {"-1": 100, "1": 20, "3": 80}
    assert means["nip"] == pytest.approx({"-1": 0.85, "1": 0.975, "3": 0.25})
    assert means["solo"] == pytest.approx({"-1": 0.96, "1": 0.95, "3": 0.025})
    # a run without a breakdown (solo_agent) adds nothing
    assert accuracy_by_wl_score([("solo", 1, result("x", 0.5))]) == ([], {}, {"solo": {}})


def test_the_section_has_the_tables_and_the_differences_paired_by_seed():
    lines = held_out_section(RESULTS, dataset_file="data/wl-large/test.pt", baseline="solo", plot_name="cmp-heldout-1.png")
    assert lines[0] == "## Held-out file `data/wl-large/test.pt`"
    assert "200 pairs of up to 11 nodes, each pair once" in lines[2]
    assert "| nip | 0.650 ± 0.071 | 2 | 0.700, 0.600 |" in lines
    assert "| solo | 0.565 ± 0.021 | 2 | 0.550, 0.580 |" in lines
    # seed 1: 0.60 - 0.55, seed 2: 0.70 - 0.58 -> mean 0.085, std of (0.05, 0.12)
    assert "* nip: +0.085 ± 0.049 (std over 2 seeds, paired: +0.120, +0.050)" in lines
    header = "| variant | isomorphic (100 pairs) | WL 1 (20 pairs) | WL 3 (80 pairs) |"
    assert lines[lines.index(header) + 2:lines.index(header) + 4] == ["| nip | 0.850 | 0.975 | 0.250 |",
                                                                      "| solo | 0.960 | 0.950 | 0.025 |"]
    assert "![accuracy by WL score on test.pt](cmp-heldout-1.png)" in lines
    no_baseline = held_out_section(RESULTS, dataset_file="f.pt", baseline=None, plot_name=None)
    assert not any(line.startswith("* nip:") or line.startswith("![") for line in no_baseline)


def test_the_plot_is_drawn_only_with_a_breakdown_and_the_card_row_names_the_file(tmp_path):
    assert plot_by_wl_score(RESULTS, tmp_path / "a.png", "t") and (tmp_path / "a.png").stat().st_size > 0
    assert not plot_by_wl_score([("solo", 1, result("x", 0.5))], tmp_path / "b.png", "t")
    assert not (tmp_path / "b.png").exists()
    assert held_out_card_row(RESULTS, "big.pt", 2) == ("held-out file 2", "big.pt: nip 0.650, solo 0.565")


@pytest.mark.parametrize("path, label", [
    ("/root/.cache/nipflow/data/graph_isomorphism/wl-large/raw/test/data.pt", "wl-large/test"),
    ("data/graph_isomorphism/wl-small/raw/train/data.pt", "wl-small/train"),
    ("/tmp/files/big.pt", "big.pt"),
    ("/tmp/raw/data.pt", "data.pt"),
])
def test_a_file_of_the_original_layout_is_named_by_its_dataset_and_split(path, label):
    assert file_label(path) == label
    section = held_out_section(RESULTS, dataset_file=path, baseline=None, plot_name="p.png")
    assert f"![accuracy by WL score on {label}](p.png)" in section

"""The comparison of sweep variants: differences from a baseline, their spreads, the card."""

from __future__ import annotations

import math

import pytest

from nip_core.logging.comparison import GroupResult, collect, comparison_card, difference_lines, differences
from nip_core.runs import RunStore
from nip_core.runs.invocations import begin_invocation, end_invocation
from tests.nip_core.trainers.gi_helpers import make_trainer, tiny_params


def group(label, accuracies, seeds, errors=None):
    return GroupResult(label, run_ids=[f"{label}-{s}" for s in seeds], accuracies=list(accuracies),
                       sources=["test"] * len(accuracies), seeds=list(seeds),
                       standard_errors=list(errors or [None] * len(accuracies)), wall_times_s=[60.0] * len(seeds))


def test_seeds_in_both_groups_are_paired_and_the_spread_is_the_std_of_their_differences():
    nip = group("nip", [0.70, 0.60, 0.65], [3, 1, 2])
    solo = group("solo", [0.58, 0.62, 0.64], [1, 2, 3])
    [d] = differences([nip, solo], "solo")
    per_seed = [0.70 - 0.64, 0.60 - 0.58, 0.65 - 0.62]  # seeds 3, 1, 2: paired by seed, not by position
    assert d.per_seed == pytest.approx(per_seed) and d.seeds == [3, 1, 2]
    assert d.value == pytest.approx(sum(per_seed) / 3)
    mean = sum(per_seed) / 3
    assert d.spread == pytest.approx(math.sqrt(sum((x - mean) ** 2 for x in per_seed) / 2))
    assert d.spread_kind == "seeds"
    assert d.to_text() == f"{d.value:+.3f} ± {d.spread:.3f} (std over 3 seeds, paired: +0.060, +0.020, +0.030)"


def test_one_seed_each_gives_the_standard_error_of_the_two_held_out_estimates():
    [d] = differences([group("solo", [0.60], [8144], [0.03]), group("nip", [0.56], [8144], [0.04])], "solo")
    assert (d.label, d.baseline, d.spread_kind) == ("nip", "solo", "held-out")
    assert d.value == pytest.approx(-0.04) and d.spread == pytest.approx(0.05) and d.seeds == [8144]
    assert d.to_text() == "-0.040 ± 0.050 (one run each: standard error of the two held-out estimates)"
    [d] = differences([group("solo", [0.60], [1], [0.03]), group("nip", [0.56], [2], [0.04])], "solo")
    assert (d.spread_kind, d.spread) == ("held-out", pytest.approx(0.05))  # one run each, whatever the seeds
    assert d.seeds == []  # but not paired


def test_unmatched_or_repeated_seeds_are_compared_unpaired():
    nip = group("nip", [0.7, 0.8], [1, 2])
    solo = group("solo", [0.5, 0.6, 0.7], [3, 4, 5])
    [d] = differences([nip, solo], "solo")
    assert d.spread_kind == "groups" and d.value == pytest.approx(0.75 - 0.6)
    assert d.spread == pytest.approx(math.sqrt(nip.std ** 2 / 2 + solo.std ** 2 / 3))
    assert d.to_text().endswith("(unpaired: standard error of the difference of the means)")
    # a grid over another key: two runs of seed 1 per variant are not pairs
    [d] = differences([group("nip", [0.7, 0.8], [1, 1]), group("solo", [0.5, 0.6], [1, 1])], "solo")
    assert d.spread_kind == "groups"
    # a one-run group's part of the spread is its held-out standard error
    [d] = differences([group("nip", [0.7], [1], [0.03]), solo], "solo")
    assert d.spread == pytest.approx(math.sqrt(0.03 ** 2 + solo.std ** 2 / 3))


def test_a_group_without_a_counted_run_gets_no_difference_and_an_unknown_baseline_is_refused():
    empty = GroupResult("nip", run_ids=["x"], failed=["x (failed)"])
    assert differences([empty, group("solo", [0.6], [1])], "solo") == []
    with pytest.raises(ValueError, match="baseline 'alone' is not one of the variants"):
        differences([group("solo", [0.6], [1])], "alone")
    assert difference_lines([group("solo", [0.6], [1])], None) == []


def test_the_card_shows_each_variant_the_difference_and_the_wall_time():
    groups = [group("nip", [0.56], [8144], [0.014]), group("solo_verifier", [0.61], [8144], [0.013]),
              GroupResult("zk", run_ids=["z"], failed=["z (failed)"])]
    card = comparison_card(groups, title="main-1", wall_time_s=426.0, out="runs/main-1-comparison.md",
                           baseline="solo_verifier", extra=[("runs", "main-1-000, main-1-001")])
    lines = card.splitlines()
    assert lines[0].startswith("── Comparison: main-1 ──") and set(lines[-1]) == {"─"}
    width = len("nip − solo_verifier") + 2  # the longest label, then two spaces
    assert all(line[width - 2:width] == "  " and line[width] != " " for line in lines[1:-1])
    body = {line[:width].strip(): line[width:] for line in lines[1:-1]}
    assert body["nip"] == "held-out 0.560 ± 0.014 (s.e.), 1.0 min per run"
    assert body["solo_verifier"] == "held-out 0.610 ± 0.013 (s.e.), 1.0 min per run"
    assert body["zk"] == "no completed run: z (failed)"
    assert body["nip − solo_verifier"] == (f"-0.050 ± {math.hypot(0.014, 0.013):.3f} (one run each: standard "
                                           "error of the two held-out estimates)")
    assert body["wall time"] == "7.1 min in all"
    assert body["runs"] == "main-1-000, main-1-001"
    assert body["comparison"] == "runs/main-1-comparison.md"


def test_collect_reads_seed_and_held_out_standard_error_from_the_run_store(tmp_path):
    import torch

    torch.set_num_threads(1)
    trainer = make_trainer(tiny_params(seed=5, rl=dict(num_iterations=1)), tmp_path, run_id="one")
    index = begin_invocation(trainer.run, "direct")
    trainer.train()
    end_invocation(trainer.run, index, "completed")
    trainer.close()
    store = RunStore(str(tmp_path))
    [g] = collect(store, [("nip", "one")])
    test = [r for r in store.open_run("one").read_metrics() if r["kind"] == "test"][-1]
    p = test["test_mean_decided_accuracy"]
    assert g.seeds == [5] and g.accuracies == [p] and g.sources == ["test"]
    assert g.standard_errors == [pytest.approx(math.sqrt(p * (1 - p) / test["test_num_episodes"]))]

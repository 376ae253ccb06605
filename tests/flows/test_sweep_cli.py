"""``nipflow sweep``: sweep files, variants x grid through the sweep flow, and the comparison."""

from __future__ import annotations

import json
import statistics

import pytest

from flows.cli import main
from flows.sweep import sweep_points
from flows.sweep_cli import SweepFileError, load_sweep_file


def card_value(card: list[str], key: str) -> str:
    """The value of the card's row ``key`` (the keys are padded to one width)."""
    found = [line[len(key):].strip() for line in card if line.startswith(key + "  ")]
    assert len(found) == 1, (key, card)
    return found[0]


def write(tmp_path, content) -> str:
    path = tmp_path / "sweep.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


def test_points_are_every_variant_with_every_grid_point_in_order():
    points = sweep_points({"seed": [1, 2]}, {"nip": {"interaction_protocol": "nip"},
                                             "zk": {"interaction_protocol": "nip",
                                                    "protocol_common.zero_knowledge": True}})
    assert points == [("nip", {"interaction_protocol": "nip", "seed": 1}),
                      ("nip", {"interaction_protocol": "nip", "seed": 2}),
                      ("zk", {"interaction_protocol": "nip", "protocol_common.zero_knowledge": True, "seed": 1}),
                      ("zk", {"interaction_protocol": "nip", "protocol_common.zero_knowledge": True, "seed": 2})]
    assert sweep_points({"seed": [3]}) == [(None, {"seed": 3})]
    with pytest.raises(ValueError, match="'seed' is set both by a variant and by the grid"):
        sweep_points({"seed": [1]}, {"a": {"seed": 2}})


@pytest.mark.parametrize("content, message", [
    ("{not json", "not valid JSON"),
    ({"variants": {"a": {}}, "grid": {"seed": [1]}, "budget": 3}, "unknown field 'budget'"),
    ({"variants": {"a": "nip"}}, "'variants' must map names to objects"),
    ({"grid": {"seed": []}}, "'grid' must map dotted keys to non-empty lists"),
    ({"title": "nothing"}, "nothing to sweep"),
    ({"variants": {"nip": {}}, "baseline": "solo"}, "'baseline' 'solo' is not one of the variants \\['nip'\\]"),
    ({"grid": {"seed": [1]}, "baseline": "solo"}, "'baseline' 'solo' is not one of the variants"),
])
def test_bad_sweep_files_are_refused_naming_file_and_field(tmp_path, content, message):
    path = write(tmp_path, content)
    with pytest.raises(SweepFileError, match=message) as error:
        load_sweep_file(path)
    assert path in str(error.value)


def test_the_cli_refuses_bad_input_before_training(tmp_path, capsys):
    runs = tmp_path / "runs"
    good = write(tmp_path, {"variants": {"a": {"interaction_protocol": "nip"}}})
    assert main(["sweep", good, "--params", "configs/gi_nip_ppo_small.json", "--sweep-id", "s",
                 "--runs-dir", str(runs), "--out", str(tmp_path / "cmp.txt")]) == 2
    assert "expected a markdown file name ending in .md" in capsys.readouterr().err
    assert main(["sweep", good, "--sweep-id", "s", "--runs-dir", str(runs)]) == 2
    assert "--params FILE and/or --scenario" in capsys.readouterr().err
    assert main(["sweep", good, "--params", "configs/gi_nip_ppo_small.json", "--sweep-id", "s", "--direct",
                 "--runs-dir", str(runs)]) == 2
    assert "--direct is not available" in capsys.readouterr().err
    missing = tmp_path / "missing.pt"
    assert main(["sweep", good, "--params", "configs/gi_nip_ppo_small.json", "--sweep-id", "s",
                 "--runs-dir", str(runs), "--evaluate", str(missing)]) == 2
    assert f"--evaluate {missing}: " in capsys.readouterr().err
    assert main(["sweep", good, "--scenario", "code_validation", "--trainer", "pure_text_ei", "--sweep-id", "s",
                 "--runs-dir", str(runs), "--evaluate", str(missing)]) == 2
    assert "--evaluate: tests graph-isomorphism runs on a dataset file; this sweep's scenario is code_validation" \
        in capsys.readouterr().err
    assert not runs.exists()  # nothing was started


@pytest.mark.slow
def test_a_sweep_trains_every_point_through_prefect_and_writes_the_comparison(prefect_server, tmp_path,
                                                                               capsys, one_thread):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName

    from nip_core.evaluation import evaluate_run
    from nip_core.logging.result_card import result_card
    from nip_core.runs import RunStore
    from tests.nip_core.evaluation_helpers import BIG_MAX_NODES, NUM_BIG_PAIRS, write_files

    spec = write(tmp_path, {"title": "Two protocols", "description": "A tiny check.", "baseline": "solo",
                            "variants": {"nip": {"interaction_protocol": "nip"},
                                         "solo": {"interaction_protocol": "solo_verifier"}},
                            "grid": {"seed": [1, 2]}})
    out = tmp_path / "results" / "two.md"
    runs = tmp_path / "runs"
    big = write_files(tmp_path / "files")["big"]  # larger graphs than the `test` dataset's, with WL scores
    argv = ["sweep", spec, "--params", "configs/gi_nip_ppo_small.json", "--set", "dataset=test",
            "--set", "rl.num_iterations=1", "--set", "rl.frames_per_batch=64", "--set", "rl.minibatch_size=32",
            "--set", "rl.num_test_iterations=1", "--sweep-id", "tiny", "--runs-dir", str(runs),
            "--out", str(out), "--no-wandb", "--progress", "off", "--evaluate", str(big)]
    status = main(argv)
    printed = capsys.readouterr().out
    assert status == 0
    store = RunStore(str(runs))
    run_ids = [f"tiny-{i:03d}" for i in range(4)]
    assert [store.open_run(r).params.interaction_protocol for r in run_ids] == ["nip", "nip", "solo_verifier",
                                                                                 "solo_verifier"]
    assert [store.open_run(r).params.seed for r in run_ids] == [1, 2, 1, 2]
    text = out.read_text()
    assert text.startswith("# Two protocols\n\nA tiny check.")
    assert "Produced by `nipflow sweep " in text and "(4 runs, sweep `tiny`)" in text
    assert "Accuracy: the verifier's on the held-out test loop after the last iteration." in text
    main_table = text.split("\n## Held-out file")[0].splitlines()
    rows = [line for line in main_table if line.startswith("| nip |") or line.startswith("| solo |")]
    assert [row.split(" | ")[2] for row in rows] == ["2", "2"]  # n runs counted per variant
    assert (tmp_path / "results" / "two.png").stat().st_size > 0
    card = printed.splitlines()
    assert card[0].startswith("── Comparison: tiny ──")
    accuracy = {r: result_card(store.open_run(r)).final_test_accuracy for r in run_ids}
    per_seed = [accuracy["tiny-000"] - accuracy["tiny-002"], accuracy["tiny-001"] - accuracy["tiny-003"]]
    difference = (f"{statistics.fmean(per_seed):+.3f} ± {statistics.stdev(per_seed):.3f} (std over 2 seeds, "
                  f"paired: {per_seed[0]:+.3f}, {per_seed[1]:+.3f})")
    assert card_value(card, "nip − solo") == difference
    assert f"* nip: {difference}" in text.splitlines()
    assert card_value(card, "comparison") == str(out)
    assert card_value(card, "runs").startswith("tiny-000, tiny-001, tiny-002, tiny-003 (")
    walls = sum(result_card(store.open_run(r)).total_wall_time_s for r in run_ids)
    assert f"add up to {walls / 60:.1f} min." in text
    # --evaluate: every run's final checkpoint on the file of larger graphs, as `nipflow evaluate` gives it
    held_out = {r: evaluate_run(r, big, str(runs)) for r in run_ids}
    assert all(h["num_pairs"] == NUM_BIG_PAIRS and h["max_nodes"] == BIG_MAX_NODES for h in held_out.values())
    lines = text.splitlines()
    assert f"## Held-out file `{big}`" in lines
    section = lines[lines.index(f"## Held-out file `{big}`"):]
    nip = [held_out[r]["test_accuracy"] for r in run_ids[:2]]
    assert f"| nip | {statistics.fmean(nip):.3f} ± {statistics.stdev(nip):.3f} | 2 | {nip[0]:.3f}, {nip[1]:.3f} |" \
        in section
    per_seed = [held_out["tiny-000"]["test_accuracy"] - held_out["tiny-002"]["test_accuracy"],
                held_out["tiny-001"]["test_accuracy"] - held_out["tiny-003"]["test_accuracy"]]
    assert (f"* nip: {statistics.fmean(per_seed):+.3f} ± {statistics.stdev(per_seed):.3f} (std over 2 seeds, "
            f"paired: {per_seed[0]:+.3f}, {per_seed[1]:+.3f})") in section
    scores = sorted(held_out["tiny-000"]["accuracy_by_wl_score"], key=int)
    assert scores == ["-1", "1", "2", "3"]  # the file's scores (tests/nip_core/evaluation_helpers.py)
    solo_by_score = [statistics.fmean(held_out[r]["accuracy_by_wl_score"][s][0] for r in run_ids[2:]) for s in scores]
    assert "| solo | " + " | ".join(f"{a:.3f}" for a in solo_by_score) + " |" in section
    assert (tmp_path / "results" / "two-heldout-1.png").stat().st_size > 0
    assert "![accuracy by WL score on big.pt](two-heldout-1.png)" in section
    solo = [held_out[r]["test_accuracy"] for r in run_ids[2:]]
    assert card_value(card, "held-out file 1") == f"{big}: nip {statistics.fmean(nip):.3f}, solo {statistics.fmean(solo):.3f}"
    with get_client(sync_client=True) as client:
        flow_runs = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["sweep"])))
    assert any(run.state.is_completed() and run.parameters.get("sweep_id") == "tiny" for run in flow_runs)
    # the same command again trains nothing: the runs are read back and evaluated as before
    trained = {r: (sorted(p.name for p in (runs / r / "checkpoints").iterdir()), (runs / r / "metrics.jsonl").read_bytes())
               for r in run_ids}
    assert main(argv) == 0
    capsys.readouterr()
    assert {r: (sorted(p.name for p in (runs / r / "checkpoints").iterdir()), (runs / r / "metrics.jsonl").read_bytes())
            for r in run_ids} == trained
    again = out.read_text().splitlines()
    assert again[again.index(f"## Held-out file `{big}`"):] == section

"""``nipflow sweep``: sweep files, variants x grid through the sweep flow, and the comparison."""

from __future__ import annotations

import json
import statistics

import pytest

from flows.cli import main
from flows.sweep import sweep_points
from flows.sweep_cli import SweepFileError, load_sweep_file


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
    assert not runs.exists()  # nothing was started


@pytest.mark.slow
def test_a_sweep_trains_every_point_through_prefect_and_writes_the_comparison(prefect_server, tmp_path,
                                                                               capsys, one_thread):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName

    from nip_core.logging.result_card import result_card
    from nip_core.runs import RunStore

    spec = write(tmp_path, {"title": "Two protocols", "description": "A tiny check.", "baseline": "solo",
                            "variants": {"nip": {"interaction_protocol": "nip"},
                                         "solo": {"interaction_protocol": "solo_verifier"}},
                            "grid": {"seed": [1, 2]}})
    out = tmp_path / "results" / "two.md"
    runs = tmp_path / "runs"
    status = main(["sweep", spec, "--params", "configs/gi_nip_ppo_small.json", "--set", "dataset=test",
                   "--set", "rl.num_iterations=1", "--set", "rl.frames_per_batch=64", "--set", "rl.minibatch_size=32",
                   "--set", "rl.num_test_iterations=1", "--sweep-id", "tiny", "--runs-dir", str(runs),
                   "--out", str(out), "--no-wandb", "--progress", "off"])
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
    rows = [line for line in text.splitlines() if line.startswith("| nip |") or line.startswith("| solo |")]
    assert [row.split(" | ")[2] for row in rows] == ["2", "2"]  # n runs counted per variant
    assert (tmp_path / "results" / "two.png").stat().st_size > 0
    card = printed.splitlines()
    assert card[0].startswith("── Comparison: tiny ──")
    accuracy = {r: result_card(store.open_run(r)).final_test_accuracy for r in run_ids}
    per_seed = [accuracy["tiny-000"] - accuracy["tiny-002"], accuracy["tiny-001"] - accuracy["tiny-003"]]
    difference = (f"{statistics.fmean(per_seed):+.3f} ± {statistics.stdev(per_seed):.3f} (std over 2 seeds, "
                  f"paired: {per_seed[0]:+.3f}, {per_seed[1]:+.3f})")
    assert f"nip − solo  {difference}" in card
    assert f"* nip: {difference}" in text.splitlines()
    assert f"comparison  {out}" in card and "runs        tiny-000, tiny-001, tiny-002, tiny-003 (" in printed
    with get_client(sync_client=True) as client:
        flow_runs = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["sweep"])))
    assert any(run.state.is_completed() and run.parameters.get("sweep_id") == "tiny" for run in flow_runs)

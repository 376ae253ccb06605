"""``benchmarks/orchestration_overhead.py`` keeps working: smallest run, output format, overheads >= 0.

No assertion on speed: only that the benchmark runs both parts end to end, measures every
stage of the text run in both modes, and reports per-stage overheads that are
``task wall - stage work`` and never negative.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "orchestration_overhead.py"

# rl.num_iterations=2 with the default test scheme: fine-tune jobs after iteration 0 only.
TEXT_STAGES = [(0, "sample_rollouts"), (0, "log_stats"), (0, "test_during_training"),
               (0, "create_fine_tune_jobs"), (0, "await_fine_tune_jobs"), (1, "sample_rollouts"),
               (1, "log_stats"), (1, "test_during_training"), (2, "test")]
LAST_LINE = re.compile(r"ppo_ratio=(?P<ppo>\S+) text_overhead_per_stage_s=(?P<text>\S+)(?P<extra>( \w+=\S+)*)")


def _module():
    spec = importlib.util.spec_from_file_location("orchestration_overhead", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_spread_is_median_quartiles_and_range():
    bench = _module()
    assert bench.spread([4.0, 1.0, 3.0, 2.0]) == dict(median=2.5, q1=1.75, q3=3.25, min=1.0, max=4.0, n=4)
    assert bench.spread([0.5]) == dict(median=0.5, q1=0.5, q3=0.5, min=0.5, max=0.5, n=1)
    assert bench.spread([])["n"] == 0 and math.isnan(bench.spread([])["median"])


@pytest.mark.parametrize("argv, word", [(["--repeats", "0"], "--repeats"),
                                        (["--ppo-set", "rl.lr"], "KEY=VALUE"),
                                        (["--skip-ppo", "--skip-text"], "nothing to measure"),
                                        (["--poll-interval", "0"], "--poll-interval")])
def test_bad_options_are_refused_naming_them(argv, word, capsys):
    with pytest.raises(SystemExit) as exc:
        _module().parse_args(argv)
    assert exc.value.code == 2
    assert word in capsys.readouterr().err


@pytest.mark.slow
def test_smallest_run_reports_both_parts_and_nonnegative_stage_overheads(tmp_path):
    out = tmp_path / "bench.json"
    env = {**os.environ, "NIPFLOW_DATA_DIR": str(tmp_path / "data"), "OMP_NUM_THREADS": "1"}
    env.pop("PREFECT_API_URL", None)
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--repeats", "1", "--iterations", "2", "--block-size", "1",
         "--ppo-set", "dataset=test", "--ppo-set", "rl.frames_per_batch=16", "--ppo-set", "rl.num_epochs=1",
         "--ppo-set", "rl.minibatch_size=8", "--ppo-set", "rl.num_normalization_steps=3",
         "--ppo-set", "rl.num_test_iterations=1", "--text-iterations", "2", "--json-out", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    match = LAST_LINE.fullmatch(last)
    assert match, last
    extra = dict(item.split("=", 1) for item in match["extra"].split())
    assert set(extra) == {"text_overhead_max_s", "text_stages", "text_ratio", "repeats"}
    assert extra["text_stages"] == str(len(TEXT_STAGES)) and extra["repeats"] == "1"
    ppo_ratio, per_stage = float(match["ppo"]), float(match["text"])
    assert math.isfinite(ppo_ratio) and ppo_ratio > 0
    assert 0 <= per_stage <= float(extra["text_overhead_max_s"])

    results = json.loads(out.read_text())
    (ppo,) = results["ppo"]
    assert ppo["rep"] == 0 and ppo["direct_s"] > 0 and ppo["flow_s"] > 0
    assert ppo_ratio == pytest.approx(ppo["flow_s"] / ppo["direct_s"], abs=1e-4)
    (text,) = results["text"]
    for mode in ("direct_stages", "flow_stages"):
        assert [(s["iteration"], s["stage"]) for s in text[mode]] == TEXT_STAGES, mode
        assert all(s["executed"] for s in text[mode])
    for s in text["flow_stages"]:
        assert s["task_s"] >= s["run_stage_s"] >= s["work_s"] >= 0
        assert s["overhead_s"] == pytest.approx(s["task_s"] - s["work_s"]) and s["overhead_s"] >= 0
    overheads = sorted(s["overhead_s"] for s in text["flow_stages"])
    assert per_stage == pytest.approx(overheads[len(overheads) // 2], abs=1e-4)  # median of 9
    assert "fine-tune wait (await_fine_tune_jobs work, excluded from the overhead)" in proc.stdout

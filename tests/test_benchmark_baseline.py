"""benchmarks/gi_ppo.py --baseline REF (REF's code on today's workload, interleaved) and benchmarks/roofline.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

from same_run_baseline import abba, speedup  # noqa: E402


def test_abba_alternates_the_order_and_measures_each_side_equally():
    assert abba(1) == ["current", "baseline"]
    assert abba(2) == ["current", "baseline", "baseline", "current"]
    assert abba(3).count("current") == abba(3).count("baseline") == 3


def test_speedup_is_the_baselines_mean_time_over_the_current_one_with_the_pair_spread():
    ratio, low, high = speedup(current=[1.0, 3.0], baseline=[4.0, 6.0])
    assert ratio == pytest.approx(2.5)
    assert (low, high) == (pytest.approx(4 / 3), pytest.approx(6.0))


@pytest.mark.slow
def test_baseline_runs_the_refs_code_in_a_worktree_and_ends_with_the_machine_readable_line():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("NIPFLOW_BENCH_CODE_ROOT", None)
    done = subprocess.run([sys.executable, "benchmarks/gi_ppo.py", "--workload", "tiny", "--iterations", "1",
                           "--baseline", "HEAD", "--repetitions", "1", "--device", "cpu"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    assert lines[0].startswith("CPU: ")
    roots = dict(re.findall(r"^\s*(current|baseline) .* code=(\S+)$", done.stdout, re.M))
    assert roots["current"] == str(REPO)
    assert roots["baseline"] != str(REPO) and roots["baseline"].endswith("/tree")
    assert not Path(roots["baseline"]).exists()  # the worktree is removed afterwards
    assert re.fullmatch(r"s_per_iter=[\d.]+ frames_per_s=[\d.]+ peak_rss_mb=\d+ speedup_vs_HEAD=[\d.]+", lines[-1])
    worktrees = subprocess.run(["git", "worktree", "list"], cwd=REPO, capture_output=True, text=True).stdout
    assert roots["baseline"] not in worktrees


@pytest.mark.slow
def test_roofline_reports_the_machine_limits_and_a_bound_below_the_measured_step():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "benchmarks/roofline.py", "--workload", "tiny", "--top", "3"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    last = done.stdout.strip().splitlines()[-1]
    figures = dict(item.split("=") for item in last.split())
    assert set(figures) == {"triad_gb_s", "gemm_fp32_gflop_s", "gemm_bf16_gflop_s", "step_ms", "bound_ms"}
    assert all(float(v) > 0 for v in figures.values())
    assert float(figures["bound_ms"]) < float(figures["step_ms"])  # a lower bound is below what is measured
    assert "| aten::" in done.stdout  # the op table
    assert done.stdout.startswith("CPU: ") and "unknown CPU" not in done.stdout  # figures name the machine


@pytest.mark.slow
def test_curves_of_equal_code_are_equal_to_the_bit():
    """benchmarks/gi_curves.py trains the paper's agents under this checkout's code and a ref's;
    the same code in another process gives the same curves exactly (the comparison means
    something only because training is deterministic)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("NIPFLOW_BENCH_CODE_ROOT", None)
    done = subprocess.run([sys.executable, "benchmarks/gi_curves.py", "--iterations", "2", "--baseline", "HEAD"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line.strip("|").split("|") for line in done.stdout.splitlines() if re.match(r"\| \d+ \|", line)]
    assert [int(row[0]) for row in rows] == [0, 1]
    for row in rows:
        cells = [float(cell) for cell in row[1:]]
        assert len(cells) == 6 and cells[:3] == cells[3:]  # current | HEAD, cell by cell
    match = re.fullmatch(r"final_test_reward=(\S+) baseline_final_test_reward=(\S+)",
                         done.stdout.strip().splitlines()[-1])
    assert match and match.group(1) == match.group(2)

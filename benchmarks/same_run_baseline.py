"""Compare the current code with a git ref's code, in one run, on the same workload.

A benchmark that takes ``--baseline REF`` checks REF out into a temporary ``git worktree``
and runs itself again, once per measurement, as a child process of the same interpreter:
children of the current code import this checkout's ``nip_core``, children of the baseline
the worktree's (``NIPFLOW_BENCH_CODE_ROOT``). The workload is whatever the benchmark script
of *this* checkout builds, so both sides run the same configuration through their own code.
The order is ABBA (current, baseline, baseline, current, ...) so that a machine that speeds
up or slows down during the run favours neither side.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from statistics import mean
from typing import Iterator

REPO = Path(__file__).resolve().parent.parent
CODE_ROOT_ENV = "NIPFLOW_BENCH_CODE_ROOT"
RESULT_PREFIX = "BENCH_RESULT "


def cpu_model() -> str:
    """This machine's CPU model as ``lscpu`` names it (every figure is reported with it)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def code_root() -> Path:
    """Where this process imports ``nip_core`` from: a baseline worktree or this checkout."""
    return Path(os.environ.get(CODE_ROOT_ENV) or REPO)


@contextlib.contextmanager
def worktree(ref: str) -> Iterator[Path]:
    """A detached checkout of ``ref`` in a temporary directory, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="nipflow-baseline-") as tmp:
        path = Path(tmp) / "tree"
        done = subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(path), ref],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"--baseline {ref}: git worktree add failed: {done.stderr.strip()}")
        try:
            yield path
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(path)],
                           capture_output=True)


def abba(repetitions: int) -> list[str]:
    """``["current", "baseline", "baseline", "current", ...]``, ``repetitions`` of each."""
    order: list[str] = []
    for i in range(repetitions):
        order += ["current", "baseline"] if i % 2 == 0 else ["baseline", "current"]
    return order


def run_child(script: Path, argv: list[str], root: Path) -> dict:
    """Run ``script argv`` with ``nip_core`` from ``root``; its ``BENCH_RESULT`` line as a dict."""
    env = {**os.environ, CODE_ROOT_ENV: str(root)}
    done = subprocess.run([sys.executable, str(script), *argv, "--result-line"], env=env,
                          capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if done.returncode != 0 or not lines:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-15:])
        raise SystemExit(f"benchmark child ({root}) failed with exit code {done.returncode}:\n{tail}")
    return json.loads(lines[-1][len(RESULT_PREFIX):])


def compare(script: Path, argv: list[str], ref: str, repetitions: int) -> tuple[list[dict], list[dict]]:
    """``(current results, baseline results)``, measured interleaved (:func:`abba`)."""
    results: dict[str, list[dict]] = {"current": [], "baseline": []}
    with worktree(ref) as tree:
        for side in abba(repetitions):
            result = run_child(script, argv, REPO if side == "current" else tree)
            results[side].append(result)
            print(f"{side:>8} ({ref if side == 'baseline' else 'this checkout'}): "
                  f"s_per_iter={result['s_per_iter']:.3f} peak_rss_mb={result['peak_rss_mb']} "
                  f"code={result['code_root']}", flush=True)
    return results["current"], results["baseline"]


def speedup(current: list[float], baseline: list[float]) -> tuple[float, float, float]:
    """``(ratio of the means, lowest, highest)`` of baseline time / current time over all pairs."""
    pairs = [b / c for b in baseline for c in current]
    return mean(baseline) / mean(current), min(pairs), max(pairs)

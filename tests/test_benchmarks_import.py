"""Every benchmark script imports against today's code (they run on demand only, so a renamed
function would otherwise break them unnoticed: benchmarks/text_rollouts.py once imported a
sampler that had been renamed)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCHMARKS = sorted((Path(__file__).resolve().parents[1] / "benchmarks").glob("*.py"))


@pytest.mark.parametrize("script", BENCHMARKS, ids=[p.stem for p in BENCHMARKS])
def test_the_benchmark_script_imports(script):
    spec = importlib.util.spec_from_file_location(f"benchmark_{script.stem}", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # the scripts only run under __main__
    assert module.__doc__ and callable(getattr(module, "main", None)) or script.stem == "same_run_baseline"

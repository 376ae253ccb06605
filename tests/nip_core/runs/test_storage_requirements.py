"""The run store's dependency declarations: ranges in pyproject.toml, exact pins in constraints.txt."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[3]


def _project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _pins() -> dict[str, Version]:
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[name.strip().lower()] = Version(version.strip())
    return pins


def test_fsspec_lower_bound_has_exclusive_create():
    """``pipe_file(mode="create")`` (the S3 lease claim) needs fsspec 2024.12."""
    fsspec = next(Requirement(r) for r in _project()["dependencies"] if Requirement(r).name == "fsspec")
    assert not fsspec.specifier.contains("2024.11.0")
    assert fsspec.specifier.contains("2024.12.0") and fsspec.specifier.contains("2026.9.0")


def test_dependencies_are_ranges_and_the_constraints_pins_fall_inside_them():
    project = _project()
    requirements = [Requirement(r) for r in project["dependencies"]]
    requirements += [Requirement(r) for extra in project["optional-dependencies"].values() for r in extra]
    exact = [str(r) for r in requirements if any(s.operator in ("==", "===") for s in r.specifier)]
    # torch alone stays exact: 2.13.0 is the local CPU build on the project machines, and any
    # other request (a range included, without the constraints file) downloads a CUDA build
    assert exact == ["torch==2.13.0"], "exact pins belong in constraints.txt (torch aside)"
    pins = _pins()
    outside = [f"{r} (pinned {pins[r.name.lower()]})" for r in requirements
               if r.name.lower() in pins and not r.specifier.contains(pins[r.name.lower()], prereleases=True)]
    assert outside == []
    for name in ("torch", "tensordict", "torchrl", "prefect", "fsspec"):
        assert name in pins, f"{name} has no exact pin in constraints.txt"

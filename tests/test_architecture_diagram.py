"""The layer diagram of nip_core in docs/architecture.md is the import contract that lint-imports checks.

The diagram (section "Layers inside nip_core") lists the packages from the top down, one
layer per line, independent ones separated by ``|``; the contract ``nip_core packages in
layers`` of ``pyproject.toml`` must list the same layers in the same order, and together they
must name every package and top-level module of ``nip_core`` (a new one must be placed).
``tests/test_import_contracts.py`` runs lint-imports, which keeps the contract.

The two sequence diagrams (a TensorDict RL block, a pure-text iteration) name real code: each
participant is a dotted path that imports, and each arrow's first word is a function or
method of the participant it points at, so a rename that the diagrams miss fails here.
"""

from __future__ import annotations

import importlib
import inspect
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def documented_layers() -> list[set[str]]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text[text.index("### Layers inside nip_core"):]
    block = re.search(r"```text\n(.*?)```", section, re.S).group(1)
    layers = []
    for line in block.splitlines():
        names = re.match(r"^([a-z_]+(?: \| [a-z_]+)*)\s{2,}", line)
        assert names, f"not a layer line: {line!r}"
        layers.append({f"nip_core.{n.strip()}" for n in names.group(1).split("|")})
    return layers


def contract_layers() -> list[set[str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (contract,) = [c for c in config["tool"]["importlinter"]["contracts"] if c["name"] == "nip_core packages in layers"]
    return [{m.strip() for m in layer.split("|")} for layer in contract["layers"]]


def test_the_diagram_is_the_contract():
    assert documented_layers() == contract_layers()


def test_every_package_and_module_of_nip_core_has_a_layer():
    children = {f"nip_core.{p.stem}" for p in (ROOT / "nip_core").iterdir()
                if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.stem != "__init__")}
    placed = set().union(*documented_layers())
    assert placed == children, {"not placed": sorted(children - placed), "gone": sorted(placed - children)}


# --- the sequence diagrams: every participant exists, every call names something it has ----------


def _resolve(dotted: str):
    """The module, class or function a participant names (the longest importable prefix, then attributes)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


def _has(target, name: str) -> bool:
    if inspect.ismodule(target) or inspect.isclass(target):
        return hasattr(target, name)
    function = getattr(target, "fn", target)  # a Prefect flow or task wraps its function
    return function.__name__ == name or hasattr(inspect.getmodule(function), name)


def sequence_diagrams(text: str) -> list[str]:
    return re.findall(r"```mermaid\n(sequenceDiagram\n.*?)```", text, re.S)


def unknown_calls(diagram: str) -> list[str]:
    """The messages whose first name is not an attribute of the participant they point at."""
    participants = dict(re.findall(r"^\s*participant (\w+) as ([\w.]+)\s*$", diagram, re.M))
    targets = {alias: _resolve(path) for alias, path in participants.items()}
    bad = []
    for sender, receiver, name in re.findall(r"^\s*(\w+)->>(\w+):\s*(\w+)", diagram, re.M):
        if sender not in targets or not _has(targets[receiver], name):
            bad.append(f"{sender}->>{receiver}: {name}")
    return bad


def test_every_call_of_the_sequence_diagrams_exists():
    diagrams = sequence_diagrams((ROOT / "docs" / "architecture.md").read_text())
    assert len(diagrams) == 2  # a TensorDict block and a pure-text iteration
    for diagram in diagrams:
        assert len(re.findall(r"->>", diagram)) >= 15
        assert unknown_calls(diagram) == []


def test_a_renamed_method_is_caught():
    (diagram,) = [d for d in sequence_diagrams((ROOT / "docs" / "architecture.md").read_text())
                  if "run_iterations(" in d]  # the RL block's
    assert unknown_calls(diagram.replace("run_iterations(", "run_iteration_range(")) == [
        "K->>T: run_iteration_range"]


LAYERS = {"flows": 2, "tasks": 1, "nip_core": 0}


def documented_walk(name: str) -> list[str]:
    """The frames of the walk ``name`` (``loss``, ``fine-tune``) of docs/architecture.md#params-walk,
    outermost first."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text.split(f"<!-- walk: {name} -->", 1)[1].split("<!-- /walk -->", 1)[0]
    return re.findall(r"^\d+\. `([\w.]+)`", block, re.MULTILINE)


@pytest.mark.parametrize("walk", ["loss", "fine-tune"])
def test_the_walk_of_the_parameters_names_real_code_and_only_goes_down_the_layers(walk):
    """Each frame exists; no frame calls into a layer above its own. That the frames are the
    real stack of a run is checked in tests/flows/test_params_built_once.py."""
    frames = documented_walk(walk)
    assert len(frames) >= 10
    for frame in frames:
        assert callable(_resolve(frame)), frame
    layers = [LAYERS[frame.split(".")[0]] for frame in frames]
    assert layers == sorted(layers, reverse=True), list(zip(frames, layers))
    assert set(layers) == {0, 1, 2}  # the orchestration, the tasks, the domain: each crossed once

"""The import contracts of ``[tool.importlinter]`` in pyproject.toml, and no import circles.

``lint-imports`` checks the layers (flows above tasks above nip_core), that nip_core never
imports Prefect nor the local API server (the sibling package nipflow_llm_server), the
layers of nip_core's own packages (each imports only those below it), that the parameters
import no torch, and that no siblings of flows, tasks or a nip_core subpackage import each
other in a circle. The module graph of all three packages (imports inside functions
included, ``if TYPE_CHECKING:`` imports excluded) is checked for circles here as well,
across packages: the only circles left are listed in ``KNOWN_CIRCLES`` (none today), so a
new one fails.
"""

import importlib.metadata
import subprocess
import sys
import textwrap
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"

#: Circles of modules that import each other inside functions, left to their modules' owners
#: (issue #17); ``[tool.importlinter]`` ignores exactly these two imports.
KNOWN_CIRCLES: set[frozenset[str]] = set()


def _lint_imports(cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT_IMPORTS), "--config", "pyproject.toml", "--no-cache"], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def _circles(graph) -> set[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.add(frozenset(component))
    return found


def test_lint_imports_keeps_every_contract_of_the_project():
    out = _lint_imports(ROOT)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "Contracts: 7 kept, 0 broken." in out.stdout, out.stdout[-4000:]
    # inside nip_core every import points down (issue #25), and the parameters need no torch
    assert "nip_core packages in layers KEPT" in out.stdout
    assert "The parameters import no torch KEPT" in out.stdout
    # the local API server is a sibling package: nip_core and tasks never import it, and it
    # uses only nip_core's leaf layers and API client (issue #25 item 4)
    assert "nip_core never imports the local API server KEPT" in out.stdout
    assert "The local API server uses only nip_core's leaf layers and API client KEPT" in out.stdout


def test_the_only_import_circles_left_are_the_known_ones():
    graph = grimp.build_graph("nip_core", "flows", "tasks", "nipflow_llm_server", exclude_type_checking_imports=True,
                              cache_dir=None)
    assert _circles(graph) == KNOWN_CIRCLES


def test_nothing_in_the_domain_library_imports_the_local_api_server():
    graph = grimp.build_graph("nip_core", "tasks", "nipflow_llm_server", exclude_type_checking_imports=True,
                              cache_dir=None)
    for package in ("nip_core", "tasks"):
        assert not graph.chain_exists(importer=package, imported="nipflow_llm_server", as_packages=True)
    # the server itself does use the domain library's leaf layers (so the check is not vacuous)
    assert graph.chain_exists(importer="nipflow_llm_server", imported="nip_core.utils", as_packages=True)
    graph.add_import(importer="nip_core.agents.pure_text", imported="nipflow_llm_server.policy.formats")
    assert graph.chain_exists(importer="nip_core", imported="nipflow_llm_server", as_packages=True)


def test_a_new_circle_is_found():
    graph = grimp.build_graph("flows", "tasks", exclude_type_checking_imports=True, cache_dir=None)
    assert _circles(graph) == set()
    graph.add_import(importer="flows.trainer_access", imported="flows.experiment")  # as before issue #17
    # experiment -> trainer_access directly, and experiment -> rl_blocks -> trainer_access
    assert _circles(graph) == {frozenset({"flows.experiment", "flows.rl_blocks", "flows.trainer_access"})}


def test_lint_imports_fails_on_a_circle_and_on_a_crossed_layer(tmp_path):
    """The same contract types on a two-package project that breaks both."""
    (tmp_path / "upper").mkdir()
    (tmp_path / "lower").mkdir()
    (tmp_path / "upper" / "__init__.py").write_text("")
    (tmp_path / "upper" / "a.py").write_text("def f():\n    from upper import b\n    return b\n")
    (tmp_path / "upper" / "b.py").write_text("import upper.a\n")
    (tmp_path / "lower" / "__init__.py").write_text("")
    (tmp_path / "lower" / "c.py").write_text("def g():\n    import upper.a\n")
    (tmp_path / "pyproject.toml").write_text(textwrap.dedent("""\
        [tool.importlinter]
        root_packages = ["upper", "lower"]

        [[tool.importlinter.contracts]]
        name = "layers"
        type = "layers"
        layers = ["upper", "lower"]

        [[tool.importlinter.contracts]]
        name = "circles"
        type = "acyclic_siblings"
        ancestors = ["upper"]
        """))
    out = _lint_imports(tmp_path)
    assert out.returncode == 1, out.stdout
    assert "Contracts: 0 kept, 2 broken." in out.stdout, out.stdout


def test_import_linter_is_the_pinned_version():
    pinned = [line for line in (ROOT / "constraints.txt").read_text().splitlines()
              if line.startswith("import-linter==")]
    assert pinned == [f"import-linter=={importlib.metadata.version('import-linter')}"]


def test_no_flow_or_task_module_is_named_like_a_library():
    """A file entrypoint puts its folder first on ``sys.path``: a module there named like a
    library would shadow it (``flows/tensordict.py`` did, and ``flows/secrets.py``, now
    ``flows/secret_blocks.py``, shadowed the standard library's ``secrets``)."""
    libraries = set(sys.stdlib_module_names) | set(importlib.metadata.packages_distributions())
    names = {p.stem for package in ("flows", "tasks") for p in (ROOT / package).glob("*.py")}
    assert names & libraries == set()

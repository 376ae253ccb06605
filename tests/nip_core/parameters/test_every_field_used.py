"""Every accepted option does something or is refused (issue #18, point 3).

The test enumerates every leaf field of the ``HyperParameters`` tree (nested groups, every
member of the agent-parameter union, update schedules, learning-rate factors) and of
``ExperimentSettings``, and fails on a field that no production code reads and that is not
refused.

How "read" is decided: a static scan (``ast``) of every module under ``nip_core/``,
``flows/`` and ``tasks/``. Each of these counts as a read of the name ``x``, together with a
*token* that says on what it was read:

* an attribute load ``<expr>.x`` (token: the last name of ``<expr>``: ``hp.rl.x`` -> ``rl``,
  ``self.x`` -> ``self``, ``hp.agent_params(n).x`` -> ``agent_params``);
* ``getattr(<expr>, "x")`` / ``hasattr(<expr>, "x")``;
* ``<expr>["x"]``, ``<expr>.get("x")``, ``<expr>.pop("x")`` (parameters as a dumped dict);
* a string constant equal to the field's whole dotted path (``"reinforce.use_advantage_and_critic"``,
  read through ``ParamsModel.get``).

A local variable assigned from an attribute or a call (``params = self.protocol_params``)
carries the token of that expression, so aliases count. Inside the class of a parameter
model, ``self.x`` is a read by the model's own method (``UpdateSchedule.is_active``) under the
class's name; validators (``@field_validator``/``@model_validator``) check values but do not
use them, so reads inside them do not count.

A field of a group counts as read when its name is read with a token naming the group (its
attribute name, e.g. ``ppo``, or the class name, or one of the few aliases in
:data:`GROUP_ALIASES`). A bare read of the name under any token is enough only when the
name is unambiguous: no other parameter class declares a field of that name and no
non-parameter class in the scanned code defines an attribute of that name (so ``enabled``
or ``start`` read on something else do not count for ``message_regression.enabled``).

Not checked: groups themselves (their fields are), a group with no fields (``vanilla_ppo``:
accepts only ``{}``), and fields whose type admits one value only (``kind`` discriminators,
``model_provider: Literal["OpenAI"]``): they cannot select anything, and any other value is
refused by their type.

A field declared with ``unsupported_field`` (refused unless at its default) counts as
handled only if ``test_refused_fields.py`` tests its refusal; :func:`test_the_scan_sees_every_refused_field_as_unread`
checks that the scan is not vacuous: without the refusals it flags exactly the refused
fields (and the in-progress allowance).
"""

from __future__ import annotations

import ast
import collections
import types
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from nip_core.parameters import HyperParameters
from nip_core.parameters.base import unsupported_reason
from nip_core.settings import ExperimentSettings

ROOT = Path(__file__).resolve().parents[3]
SCANNED_DIRS = ("nip_core", "flows", "tasks")
REFUSAL_TEST = Path(__file__).with_name("test_refused_fields.py")

#: Names under which code holds a whole parameter group (beyond its attribute name and its
#: class name). Roots are passed around whole; agent parameters come from
#: ``hp.agent_params(name)`` and are handed to the agents' constructors as ``params``.
GROUP_ALIASES: dict[str, set[str]] = {
    "HyperParameters": {"hyper_params", "hp", "params"},
    "ExperimentSettings": {"settings"},
    "AgentParameters": {"agent_params", "params"},
    "_RoundLimits": {"protocol_params"},
}

#: Fields read generically (e.g. the whole model dumped and handed on), which a name scan
#: cannot see: path -> where and how. Empty today; keep it tiny and explained.
READ_GENERICALLY: dict[str, str] = {}



# --- the fields ------------------------------------------------------------------------


def models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models anywhere in a type annotation (unions, containers, ``Annotated``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        args = args[:1]
    elif origin not in (Union, types.UnionType, list, dict, tuple, set):
        return []
    return [m for a in args for m in models_in(a)]


class Leaf:
    """One leaf field: dotted path (``agents.*.x`` for agent entries), its model and tokens."""

    def __init__(self, path: str, model: type[BaseModel], name: str, info: FieldInfo, tokens: frozenset[str]):
        self.path, self.model, self.name, self.info = path, model, name, info
        self.tokens = set(tokens)
        for cls in model.__mro__:
            self.tokens.add(cls.__name__)
            self.tokens |= GROUP_ALIASES.get(cls.__name__, set())


def leaves(model: type[BaseModel], prefix: str, tokens: frozenset[str]) -> list[Leaf]:
    """Every leaf field under ``model``; entries of a mapping (``agents``) get the key ``*``."""
    out: list[Leaf] = []
    for name, info in model.model_fields.items():
        subs = models_in(info.annotation)
        if not subs:
            out.append(Leaf(prefix + name, model, name, info, tokens))
            continue
        in_mapping = get_origin(info.annotation) in (dict, list)
        sub_prefix = f"{prefix}{name}.*." if in_mapping else f"{prefix}{name}."
        for sub in subs:
            out.extend(leaves(sub, sub_prefix, frozenset() if in_mapping else frozenset({name})))
    return out


def all_leaves() -> dict[str, list[Leaf]]:
    """Leaves by dotted path (an agent field shared by the union members appears once per member)."""
    by_path: dict[str, list[Leaf]] = collections.defaultdict(list)
    for leaf in leaves(HyperParameters, "", frozenset()) + leaves(ExperimentSettings, "settings.", frozenset()):
        by_path[leaf.path].append(leaf)
    return dict(by_path)


def is_constant(info: FieldInfo) -> bool:
    """A field whose type admits exactly one value (``Literal["x"]``)."""
    return get_origin(info.annotation) is Literal and len(get_args(info.annotation)) == 1


# --- the scan --------------------------------------------------------------------------


class ReadScanner(ast.NodeVisitor):
    """Collect ``name -> {token}`` reads, names defined by other classes, and string constants."""

    def __init__(self, model_class_names: set[str]):
        self.model_class_names = model_class_names
        self.reads: dict[str, set[str | None]] = collections.defaultdict(set)
        self.defined_elsewhere: set[str] = set()
        self.strings: set[str] = set()
        self._aliases: list[dict[str, str]] = [{}]
        self._classes: list[str] = []

    def token(self, node: ast.AST) -> str | None:
        if isinstance(node, ast.Attribute):
            return node.attr
        if isinstance(node, ast.Name):
            return self._aliases[-1].get(node.id, node.id)
        if isinstance(node, (ast.Call, ast.Subscript)):
            return self.token(node.func if isinstance(node, ast.Call) else node.value)
        return None

    def _in_model_class(self) -> bool:
        return bool(self._classes) and self._classes[-1] in self.model_class_names

    def _read(self, on: ast.AST, name: str) -> None:
        token = self.token(on)
        if token == "self" and self._in_model_class():
            token = self._classes[-1]
        self.reads[name].add(token)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._classes.append(node.name)
        if not self._in_model_class():
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    self.defined_elsewhere.add(stmt.target.id)
                elif isinstance(stmt, ast.Assign):
                    self.defined_elsewhere.update(t.id for t in stmt.targets if isinstance(t, ast.Name))
                elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    self.defined_elsewhere.add(stmt.name)
        self.generic_visit(node)
        self._classes.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for decorator in node.decorator_list:
            target = decorator.func if isinstance(decorator, ast.Call) else decorator
            if self.token(target) in ("field_validator", "model_validator"):
                return  # a validator checks values; it does not use them
        aliases = dict(self._aliases[-1])
        for stmt in ast.walk(node):
            if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
                    and isinstance(stmt.value, (ast.Attribute, ast.Call))):
                token = self.token(stmt.value)
                if token:
                    aliases[stmt.targets[0].id] = token
        self._aliases.append(aliases)
        self.generic_visit(node)
        self._aliases.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if isinstance(node.ctx, ast.Store):
            if self.token(node.value) == "self" and not self._in_model_class():
                self.defined_elsewhere.add(node.attr)
        else:
            self._read(node.value, node.attr)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func, args = node.func, node.args
        if (isinstance(func, ast.Name) and func.id in ("getattr", "hasattr") and len(args) >= 2
                and isinstance(args[1], ast.Constant) and isinstance(args[1].value, str)):
            self._read(args[0], args[1].value)
        if (isinstance(func, ast.Attribute) and func.attr in ("get", "pop") and args
                and isinstance(args[0], ast.Constant) and isinstance(args[0].value, str)):
            self._read(func.value, args[0].value)
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if (not isinstance(node.ctx, ast.Store) and isinstance(node.slice, ast.Constant)
                and isinstance(node.slice.value, str)):
            self._read(node.value, node.slice.value)
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str):
            self.strings.add(node.value)


def scan(by_path: dict[str, list[Leaf]]) -> ReadScanner:
    names = {cls.__name__ for group in by_path.values() for leaf in group for cls in leaf.model.__mro__}
    scanner = ReadScanner(names)
    for folder in SCANNED_DIRS:
        for file in sorted((ROOT / folder).rglob("*.py")):
            scanner.visit(ast.parse(file.read_text(), filename=str(file)))
    return scanner


def ambiguous_names(by_path: dict[str, list[Leaf]]) -> set[str]:
    """Field names declared by more than one parameter class (inheritance counts once)."""
    declared_by: dict[str, set[type]] = collections.defaultdict(set)
    for group in by_path.values():
        for leaf in group:
            owner = next(c for c in leaf.model.__mro__ if leaf.name in c.__dict__.get("__annotations__", {}))
            declared_by[leaf.name].add(owner)
    return {name for name, owners in declared_by.items() if len(owners) > 1}


def unread_paths(*, honour_refusals: bool) -> list[str]:
    """Dotted paths of leaf fields that no production code reads (sorted)."""
    by_path = all_leaves()
    scanner = scan(by_path)
    ambiguous = ambiguous_names(by_path) | scanner.defined_elsewhere
    unread = []
    for path, group in by_path.items():
        if path in READ_GENERICALLY or all(is_constant(leaf.info) for leaf in group):
            continue
        if honour_refusals and all(unsupported_reason(leaf.info) for leaf in group):
            continue
        for leaf in group:
            tokens = scanner.reads.get(leaf.name, set())
            if tokens & leaf.tokens or path in scanner.strings or (tokens and leaf.name not in ambiguous):
                break
        else:
            unread.append(path)
    return sorted(unread)


def refused_paths() -> set[str]:
    """Dotted paths (``agents.*.x``) of the fields declared with ``unsupported_field``."""
    return {path for path, group in all_leaves().items() if all(unsupported_reason(leaf.info) for leaf in group)}


def refusal_test_paths() -> set[str]:
    """The field paths whose refusal ``test_refused_fields.py`` tests (its ``REFUSALS`` table)."""
    tree = ast.parse(REFUSAL_TEST.read_text())
    for node in tree.body:
        if isinstance(node, ast.AnnAssign | ast.Assign):
            targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
            if any(isinstance(t, ast.Name) and t.id == "REFUSALS" for t in targets):
                rows = ast.literal_eval(node.value)
                return {".".join("*" if i == 1 and row[0].startswith("agents.") else part
                                 for i, part in enumerate(row[0].split("."))) for row in rows}
    raise AssertionError(f"{REFUSAL_TEST} has no REFUSALS table")


# --- the tests -------------------------------------------------------------------------


def test_the_tree_walk_reaches_every_kind_of_group():
    paths = set(all_leaves())
    assert {"seed", "rl.lr", "agents.*.d_gnn", "agents.*.model_name", "agents.*.agent_lr_factor.actor",
            "agents.*.update_schedule.first_agent_num_rounds", "message_regression.mlp_num_layers",
            "spg.ihvp_rank", "base_run.run_id", "settings.device", "settings.num_rollout_workers"} <= paths
    assert len(paths) > 180


def test_every_field_is_read_by_production_code_or_refused():
    unread = unread_paths(honour_refusals=True)
    assert unread == [], (f"fields that no code in {', '.join(SCANNED_DIRS)} reads: implement them, or declare "
                          f"them with unsupported_field and test the refusal in {REFUSAL_TEST.name}: {unread}")


def test_every_refused_field_has_a_refusal_test():
    missing = sorted(refused_paths() - refusal_test_paths())
    assert missing == [], f"refused fields without a case in {REFUSAL_TEST.name}: {missing}"


def test_the_scan_sees_every_refused_field_as_unread():
    """Without the refusals, the scan flags exactly the refused fields.

    So the scan is not vacuous (it does flag unread fields, also ones with common names like
    ``message_regression.enabled``/``test_size``/``agents``) and no field is refused that
    code actually reads.
    """
    flagged = set(unread_paths(honour_refusals=False))
    assert flagged == refused_paths()
    assert {"message_regression.enabled", "message_regression.test_size", "message_regression.agents",
            "agents.*.use_dummy_api", "functionalize_modules"} <= flagged


"""AST mutation operators that turn a correct solution into a (possibly) buggy one.

Every operator looks at one AST node at a time (with its parent, for context) and
proposes zero or more single-site edits. An edit has two faces:

* an AST-level change (``apply``), made on a deep copy of the parsed tree;
* a minimal text patch of the original source, so the mutant keeps the author's
  comments, spacing and quoting (re-rendering only buggy programs with
  :func:`ast.unparse` would mark them by style alone).

:func:`generate_mutants` keeps a mutant only if parsing the patched text gives exactly
the mutated tree (``ast.dump`` equality), so the patch provably does what the
description says.

A mutant is only a *candidate*: whether it is buggy is decided by executing it on the
problem's tests (see :mod:`.build`); equivalent mutants are discarded there.

The operators model slips a programmer makes: a boundary comparison, an off-by-one in
a ``range`` bound, an index or a constant, a wrong arithmetic or boolean operator,
``min`` for ``max``, a missing ``else`` branch, ``break`` for ``continue``, a wrong
value returned by an edge-case guard, a wrong initial value, a wrong sort direction.
"""

from __future__ import annotations

import ast
import copy
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterator

from .source_text import Patch, SourceText, int_node, int_value, shift_node

__all__ = ["MUTATION_OPERATORS", "Edit", "Mutant", "MutationOperator", "generate_mutants"]


@dataclass(frozen=True)
class Edit:
    """One proposed edit: ``apply`` maps the (copied) node to its replacement."""

    apply: Callable[[ast.AST], ast.AST]
    patches: tuple[Patch, ...]
    description: str


Proposer = Callable[[ast.AST, "ast.AST | None", SourceText], list[Edit]]


@dataclass(frozen=True)
class MutationOperator:
    """A named family of single-site edits; ``propose(node, parent, source)``."""

    name: str
    summary: str
    propose: Proposer


@dataclass(frozen=True)
class Mutant:
    """A mutated program.

    Attributes
    ----------
    operator : str
        Name of the mutation operator.
    description : str
        What was changed, with the line number in the original source.
    code : str
        The mutated source.
    """

    operator: str
    description: str
    code: str


def _line(node: ast.AST) -> int:
    return getattr(node, "lineno", 0)


def _is_call_to(node: ast.AST | None, names: tuple[str, ...]) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names


def _set_attr(field: str, value_factory: Callable[[], object]) -> Callable[[ast.AST], ast.AST]:
    def apply(n: ast.AST) -> ast.AST:
        setattr(n, field, value_factory())
        return n

    return apply


def _edit(apply: Callable[[ast.AST], ast.AST], patches: list[Patch | None], description: str) -> list[Edit]:
    if not patches or any(p is None for p in patches):
        return []
    return [Edit(apply, tuple(patches), description)]


# --- operators -------------------------------------------------------------------------

# old op class -> (new op class, regex for the old symbol, new symbol text)
_CMP_FLIPS: dict[type, tuple[type, str, str]] = {
    ast.Lt: (ast.LtE, r"<(?![=<])", "<="),
    ast.LtE: (ast.Lt, r"<=", "<"),
    ast.Gt: (ast.GtE, r">(?![=>])", ">="),
    ast.GtE: (ast.Gt, r">=", ">"),
    ast.Eq: (ast.NotEq, r"==", "!="),
    ast.NotEq: (ast.Eq, r"!=", "=="),
}


def _compare_flip(node: ast.AST, parent: ast.AST | None, src: SourceText) -> list[Edit]:
    if not isinstance(node, ast.Compare):
        return []
    edits = []
    for i, op in enumerate(node.ops):
        if type(op) not in _CMP_FLIPS:
            continue
        new_cls, pattern, new_sym = _CMP_FLIPS[type(op)]
        left = node.left if i == 0 else node.comparators[i - 1]
        patch = src.replace_in_gap(left, node.comparators[i], pattern, new_sym)

        def apply(n: ast.AST, i: int = i, new_cls: type = new_cls) -> ast.AST:
            n.ops[i] = new_cls()
            return n

        old_sym = pattern.split("(")[0]
        edits += _edit(apply, [patch], f"line {_line(node)}: comparison `{old_sym}` changed to `{new_sym}`")
    return edits


def _shift_edits(
    node: ast.AST, field: str, expr: ast.AST, what: str, src: SourceText, index: int | None = None
) -> list[Edit]:
    """Edits replacing ``node.field`` (or ``node.field[index]``) by ``expr ± 1``."""
    edits = []
    for delta in (+1, -1):

        def apply(n: ast.AST, delta: int = delta) -> ast.AST:
            holder = getattr(n, field)
            if index is None:
                setattr(n, field, shift_node(holder, delta))
            else:
                holder[index] = shift_node(holder[index], delta)
            return n

        new = ast.unparse(shift_node(copy.deepcopy(expr), delta))
        description = f"line {_line(node)}: {what} `{ast.unparse(expr)}` changed to `{new}`"
        edits += _edit(apply, list(src.shift_text(expr, delta)), description)
    return edits


def _range_off_by_one(node: ast.AST, parent: ast.AST | None, src: SourceText) -> list[Edit]:
    if not _is_call_to(node, ("range",)) or not node.args or node.keywords:
        return []
    # range(stop) / range(start, stop) / range(start, stop, step)
    stop = 0 if len(node.args) == 1 else 1
    edits = _shift_edits(node, "args", node.args[stop], "range end", src, index=stop)
    if len(node.args) >= 2:
        edits += _shift_edits(node, "args", node.args[0], "range start", src, index=0)
    return edits


def _via_slice(apply: Callable[[ast.AST], ast.AST]) -> Callable[[ast.AST], ast.AST]:
    """Lift an edit of a Slice node to its Subscript (the node the walk visits)."""

    def lifted(n: ast.AST) -> ast.AST:
        apply(n.slice)
        return n

    return lifted


def _index_off_by_one(node: ast.AST, parent: ast.AST | None, src: SourceText) -> list[Edit]:
    if not isinstance(node, ast.Subscript) or not isinstance(node.ctx, ast.Load):
        return []
    slc = node.slice
    if isinstance(slc, ast.Slice):
        edits = []
        for field in ("lower", "upper"):
            bound = getattr(slc, field)
            if bound is not None:
                edits += _shift_edits(slc, field, bound, "slice bound", src)
        return [Edit(_via_slice(e.apply), e.patches, e.description) for e in edits]
    if isinstance(slc, ast.Tuple) or (isinstance(slc, ast.Constant) and int_value(slc) is None):
        return []  # multi-dimensional or dictionary-by-literal look-ups are not indices
    return _shift_edits(node, "slice", slc, "index", src)


def _constant_off_by_one(node: ast.AST, parent: ast.AST | None, src: SourceText) -> list[Edit]:
    # Only literals in arithmetic or comparisons; range arguments, indices, initial
    # values and guard returns belong to the more specific operators.
    if not (isinstance(node, ast.Constant) and type(node.value) is int):
        return []
    if not isinstance(parent, (ast.Compare, ast.BinOp)):
        return []
    edits = []
    for delta in (+1, -1):
        new_value = node.value + delta
        # `x - 0`, `x * 0` or `x % 0` are not slips anyone makes
        if new_value < 0 or (new_value == 0 and isinstance(parent, ast.BinOp)):
            continue
        apply = lambda n, v=new_value: ast.Constant(v)  # noqa: E731
        description = f"line {_line(node)}: constant `{node.value}` changed to `{new_value}`"
        edits += _edit(apply, [src.replace_node(node, str(new_value))], description)
    return edits


# old op class -> (new op class, regex for the old symbol, new symbol text)
_ARITH_SWAPS: dict[type, tuple[type, str, str]] = {
    ast.Add: (ast.Sub, r"\+", "-"),
    ast.Sub: (ast.Add, r"-", "+"),
    ast.Mult: (ast.Add, r"(?<!\*)\*(?!\*)", "+"),
    ast.FloorDiv: (ast.Mod, r"//", "%"),
    ast.Mod: (ast.FloorDiv, r"%", "//"),
}
_OP_TEXT = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "//", ast.Mod: "%"}


def _arithmetic_swap(node: ast.AST, parent: ast.AST | None, src: SourceText) -> list[Edit]:
    if not isinstance(node, (ast.BinOp, ast.AugAssign)) or type(node.op) not in _ARITH_SWAPS:
        return []
    if isinstance(node, ast.BinOp) and isinstance(node.left, (ast.Constant, ast.JoinedStr)):
        if isinstance(getattr(node.left, "value", ""), str):
            return []  # "%d" % x or string concatenation, not arithmetic
    new_cls, pattern, new_sym = _ARITH_SWAPS[type(node.op)]
    old_sym = _OP_TEXT[type(node.op)]
    if isinstance(node, ast.AugAssign):
        patch = src.replace_in_gap(node.target, node.value, pattern + "=", new_sym + "=")
        old_sym, new_sym = old_sym + "=", new_sym + "="
    else:
        patch = src.replace_in_gap(node.left, node.right, pattern, new_sym)
    description = f"line {_line(node)}: operator `{old_sym}` changed to `{new_sym}`"
    return _edit(_set_attr("op", new_cls), [patch], description)


def _boolean_swap(node: ast.AST, parent: ast.AST | None, src: SourceText) -> list[Edit]:
    if not isinstance(node, ast.BoolOp):
        return []
    old, new, new_cls = ("and", "or", ast.Or) if isinstance(node.op, ast.And) else ("or", "and", ast.And)
    patches = [
        src.replace_in_gap(a, b, rf"\b{old}\b", new) for a, b in zip(node.values, node.values[1:])
    ]
    return _edit(_set_attr("op", new_cls), patches, f"line {_line(node)}: boolean `{old}` changed to `{new}`")


def _min_max_swap(node: ast.AST, parent: ast.AST | None, src: SourceText) -> list[Edit]:
    if not _is_call_to(node, ("min", "max")):
        return []
    old = node.func.id
    new = "max" if old == "min" else "min"
    apply = _set_attr("func", lambda: ast.Name(id=new, ctx=ast.Load()))
    description = f"line {_line(node)}: `{old}(...)` changed to `{new}(...)`"
    return _edit(apply, [src.replace_node(node.func, new)], description)


def _drop_else(node: ast.AST, parent: ast.AST | None, src: SourceText) -> list[Edit]:
    # A plain `else:` block only, not an `elif` chain.
    if not isinstance(node, ast.If) or not node.orelse:
        return []
    first = node.orelse[0]
    if isinstance(first, ast.If) and src.line(first.lineno).lstrip().startswith("elif"):
        return []
    else_line = next(
        (
            k
            for k in range(first.lineno, node.body[-1].end_lineno, -1)
            if src.line(k).lstrip().startswith("else")
        ),
        None,
    )
    if else_line is None or src.line(else_line).lstrip()[4:].lstrip()[:1] != ":":
        return []
    last = node.orelse[-1].end_lineno
    end = src.line_start(last + 1) if last < src.num_lines else len(src.code)
    patch = Patch(src.line_start(else_line), end, "")
    description = f"line {else_line}: `else` branch of the `if` on line {_line(node)} removed"
    return _edit(_set_attr("orelse", list), [patch], description)


def _break_continue_swap(node: ast.AST, parent: ast.AST | None, src: SourceText) -> list[Edit]:
    if not isinstance(node, (ast.Break, ast.Continue)):
        return []
    if isinstance(node, ast.Break):
        old, new, new_cls = "break", "continue", ast.Continue
    else:
        old, new, new_cls = "continue", "break", ast.Break
    description = f"line {_line(node)}: `{old}` changed to `{new}`"
    return _edit(lambda n: new_cls(), [src.replace_node(node, new)], description)


def _early_return_value(node: ast.AST, parent: ast.AST | None, src: SourceText) -> list[Edit]:
    # A guard such as `if n < 2: return False` handles edge cases; a wrong constant
    # there only shows on those inputs.
    if not isinstance(node, ast.Return) or not isinstance(parent, ast.If):
        return []
    value = node.value
    if isinstance(value, ast.Constant) and isinstance(value.value, bool):
        new_values: list[object] = [not value.value]
    elif int_value(value) is not None:
        new_values = [int_value(value) + 1, int_value(value) - 1]
    else:
        return []
    edits = []
    for new_value in new_values:
        if isinstance(new_value, bool):
            factory = lambda v=new_value: ast.Constant(v)  # noqa: E731
        else:
            factory = lambda v=new_value: int_node(v)  # noqa: E731
        description = f"line {_line(node)}: early `return {src.text(value)}` changed to `return {new_value}`"
        edits += _edit(_set_attr("value", factory), [src.replace_node(value, str(new_value))], description)
    return edits


def _wrong_initial_value(node: ast.AST, parent: ast.AST | None, src: SourceText) -> list[Edit]:
    if not isinstance(node, ast.Assign) or len(node.targets) != 1:
        return []
    if not isinstance(node.targets[0], ast.Name):
        return []
    value = int_value(node.value)
    if value is None:
        return []
    name = node.targets[0].id
    new_values = {0: [1], 1: [0, 2], -1: [0]}.get(value, [value + 1, value - 1])
    edits = []
    for new_value in new_values:
        description = f"line {_line(node)}: `{name}` initialised to `{new_value}` instead of `{value}`"
        apply = _set_attr("value", lambda v=new_value: int_node(v))
        edits += _edit(apply, [src.replace_node(node.value, str(new_value))], description)
    return edits


def _sort_order_flip(node: ast.AST, parent: ast.AST | None, src: SourceText) -> list[Edit]:
    is_sorted = _is_call_to(node, ("sorted",))
    is_sort = isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "sort"
    if not (is_sorted or is_sort):
        return []
    args: list[ast.AST] = [*node.args, *node.keywords]
    reverse = [k for k in node.keywords if k.arg == "reverse"]
    if reverse:
        kw = reverse[0]
        pos = args.index(kw)
        if pos > 0:
            patch = Patch(src.end(args[pos - 1]), src.end(kw), "")
        elif pos + 1 < len(args):
            patch = Patch(src.start(kw), src.start(args[pos + 1]), "")
        else:
            patch = src.replace_node(kw, "")
        apply = _set_attr("keywords", lambda: [k for k in node.keywords if k.arg != "reverse"])
        return _edit(apply, [patch], f"line {_line(node)}: `reverse=` argument of the sort dropped")
    if not is_sorted:
        return []  # adding reverse=True to list.sort() is rarely a slip
    close = src.end(node) - 1
    patch = Patch(close, close, ", reverse=True" if args else "reverse=True")
    reverse_true = ast.keyword(arg="reverse", value=ast.Constant(True))
    apply = _set_attr("keywords", lambda: [*node.keywords, reverse_true])
    return _edit(apply, [patch], f"line {_line(node)}: sort order reversed (`reverse=True` added)")


MUTATION_OPERATORS: tuple[MutationOperator, ...] = (
    MutationOperator("comparison_flip", "boundary or equality comparison flipped", _compare_flip),
    MutationOperator("range_off_by_one", "range start/end shifted by one", _range_off_by_one),
    MutationOperator("index_off_by_one", "index or slice bound shifted by one", _index_off_by_one),
    MutationOperator("constant_off_by_one", "integer constant shifted by one", _constant_off_by_one),
    MutationOperator("arithmetic_swap", "arithmetic operator replaced", _arithmetic_swap),
    MutationOperator("boolean_swap", "`and`/`or` swapped", _boolean_swap),
    MutationOperator("min_max_swap", "`min`/`max` swapped", _min_max_swap),
    MutationOperator("drop_else", "`else` branch removed", _drop_else),
    MutationOperator("break_continue_swap", "`break`/`continue` swapped", _break_continue_swap),
    MutationOperator("early_return_value", "constant returned by a guard changed", _early_return_value),
    MutationOperator("wrong_initial_value", "variable initialised to a wrong constant", _wrong_initial_value),
    MutationOperator("sort_order_flip", "sort direction changed", _sort_order_flip),
)


def _walk_with_parents(tree: ast.AST) -> Iterator[tuple[ast.AST, ast.AST | None]]:
    """Breadth-first walk (the order of :func:`ast.walk`) yielding (node, parent)."""
    queue: deque[tuple[ast.AST, ast.AST | None]] = deque([(tree, None)])
    while queue:
        node, parent = queue.popleft()
        yield node, parent
        queue.extend((child, node) for child in ast.iter_child_nodes(node))


def _replace_child(parent: ast.AST, old: ast.AST, new: ast.AST) -> None:
    for field, value in ast.iter_fields(parent):
        if value is old:
            setattr(parent, field, new)
            return
        if isinstance(value, list):
            for i, item in enumerate(value):
                if item is old:
                    value[i] = new
                    return
    raise ValueError(f"node {old!r} is not a child of {parent!r}")


def _mutated_dump(tree: ast.AST, index: int, op: MutationOperator, k: int, src: SourceText) -> str | None:
    new_tree = copy.deepcopy(tree)
    node, parent = list(_walk_with_parents(new_tree))[index]
    edit = op.propose(node, parent, src)[k]  # re-proposed so closures see the copy
    replacement = edit.apply(node)
    if replacement is not node:
        if parent is None:
            return None
        _replace_child(parent, node, replacement)
    return ast.dump(new_tree)


def generate_mutants(code: str, operators: tuple[MutationOperator, ...] = MUTATION_OPERATORS) -> list[Mutant]:
    """All single-site mutants of ``code``, in a deterministic order.

    Parameters
    ----------
    code : str
        A syntactically valid Python program.
    operators : tuple of MutationOperator
        The operators to apply (default: all of :data:`MUTATION_OPERATORS`).

    Returns
    -------
    list of Mutant
        One entry per (operator, site, edit), grouped by operator, sites in
        breadth-first AST order. A mutant is kept only if its text differs from the
        original and every earlier mutant, and parses to exactly the mutated tree.
    """
    src = SourceText(code)
    tree = ast.parse(src.code)
    original_dump = ast.dump(tree)
    sites = list(_walk_with_parents(tree))
    seen = {src.code}
    mutants: list[Mutant] = []
    for op in operators:
        for index, (node, parent) in enumerate(sites):
            for k, edit in enumerate(op.propose(node, parent, src)):
                text = src.apply(list(edit.patches))
                if text in seen:
                    continue
                seen.add(text)
                try:
                    patched_dump = ast.dump(ast.parse(text))
                except SyntaxError:
                    continue
                expected = _mutated_dump(tree, index, op, k, src)
                if expected is None or patched_dump != expected or patched_dump == original_dump:
                    continue
                mutants.append(Mutant(op.name, edit.description, text))
    return mutants

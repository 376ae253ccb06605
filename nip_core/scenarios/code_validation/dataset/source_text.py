"""Source-text helpers for the mutation operators.

Mutants are produced as minimal text patches of the original source (so comments,
blank lines and quoting style stay as the author wrote them) rather than by
re-rendering the whole tree with :func:`ast.unparse`, which would leave a formatting
fingerprint on buggy code only. Each patch is checked against the AST-level edit it
is meant to implement (see :func:`.mutations.generate_mutants`).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

__all__ = ["Patch", "SourceText", "int_node", "int_value", "shift_node"]


@dataclass(frozen=True)
class Patch:
    """Replace ``text[start:end]`` by ``new``."""

    start: int
    end: int
    new: str


def int_value(node: ast.AST | None) -> int | None:
    """The value of an integer literal (``3`` or ``-3``), else ``None``."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = int_value(node.operand)
        if inner is not None and isinstance(node.operand, ast.Constant):
            return -inner
    return None


def int_node(value: int) -> ast.AST:
    """The node the parser produces for the literal ``value`` (``-2`` is a UnaryOp)."""
    if value < 0:
        return ast.UnaryOp(ast.USub(), ast.Constant(-value))
    return ast.Constant(value)


_ADDITIVE_SAFE = (
    ast.Name,
    ast.Constant,
    ast.Call,
    ast.Attribute,
    ast.Subscript,
    ast.UnaryOp,
    ast.List,
    ast.Tuple,
)


_LOOSE_BINOPS = (ast.BitOr, ast.BitAnd, ast.BitXor, ast.LShift, ast.RShift)


def shift_node(expr: ast.AST, delta: int) -> ast.AST:
    """``expr + delta`` as a programmer would write it, folding literals.

    ``3`` → ``4``; ``n - 1`` shifted by ``+1`` → ``n``; ``n + 1`` by ``+1`` →
    ``n + 2``; anything else → ``expr + 1`` / ``expr - 1``.
    """
    value = int_value(expr)
    if value is not None:
        return int_node(value + delta)
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, (ast.Add, ast.Sub)):
        right = int_value(expr.right)
        if right is not None and right >= 0:
            total = (right if isinstance(expr.op, ast.Add) else -right) + delta
            if total == 0:
                return expr.left
            return ast.BinOp(expr.left, ast.Add() if total > 0 else ast.Sub(), ast.Constant(abs(total)))
    return ast.BinOp(expr, ast.Add() if delta > 0 else ast.Sub(), ast.Constant(abs(delta)))


class SourceText:
    """A program's text with AST-position → character-offset conversion.

    Parameters
    ----------
    code : str
        The program (``\\r\\n`` line ends are normalised to ``\\n``).
    """

    def __init__(self, code: str) -> None:
        self.code = code.replace("\r\n", "\n")
        self._lines = self.code.split("\n")
        self._starts = [0]
        for line in self._lines:
            self._starts.append(self._starts[-1] + len(line) + 1)

    def offset(self, lineno: int, col_byte: int) -> int:
        """Character offset of an AST position (``col_offset`` counts UTF-8 bytes)."""
        line = self._lines[lineno - 1]
        col = len(line.encode("utf-8")[:col_byte].decode("utf-8", errors="ignore"))
        return self._starts[lineno - 1] + col

    @property
    def num_lines(self) -> int:
        """Number of lines (a trailing newline starts an empty last line)."""
        return len(self._lines)

    def line_start(self, lineno: int) -> int:
        """Offset of the first character of a (1-based) line."""
        return self._starts[lineno - 1]

    def line(self, lineno: int) -> str:
        """The text of a (1-based) line without its newline."""
        return self._lines[lineno - 1]

    def start(self, node: ast.AST) -> int:
        """Offset where ``node`` starts."""
        return self.offset(node.lineno, node.col_offset)

    def end(self, node: ast.AST) -> int:
        """Offset just after ``node``."""
        return self.offset(node.end_lineno, node.end_col_offset)

    def text(self, node: ast.AST) -> str:
        """The source text of ``node``."""
        return self.code[self.start(node) : self.end(node)]

    def replace_node(self, node: ast.AST, new: str) -> Patch:
        """A patch replacing the whole of ``node``."""
        return Patch(self.start(node), self.end(node), new)

    def replace_in_gap(self, left: ast.AST, right: ast.AST, pattern: str, new: str) -> Patch | None:
        """A patch replacing the first match of ``pattern`` between two sibling nodes.

        Used for operators, which have no node of their own: ``a <= b`` has the
        ``<=`` between the spans of ``a`` and ``b``.
        """
        gap_start = self.end(left)
        match = re.search(pattern, self.code[gap_start : self.start(right)])
        if match is None:
            return None
        return Patch(gap_start + match.start(), gap_start + match.end(), new)

    def shift_text(self, expr: ast.AST, delta: int) -> list[Patch]:
        """Patches that turn ``expr`` into :func:`shift_node` ``(expr, delta)``."""
        value = int_value(expr)
        if value is not None:
            return [self.replace_node(expr, str(value + delta))]
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, (ast.Add, ast.Sub)):
            right = int_value(expr.right)
            if right is not None and right >= 0:
                plus = isinstance(expr.op, ast.Add)
                total = (right if plus else -right) + delta
                if total == 0:
                    return [self.replace_node(expr, self.text(expr.left))]
                if (total > 0) == plus:
                    return [self.replace_node(expr.right, str(abs(total)))]
                op = self.replace_in_gap(expr.left, expr.right, r"[+-]", "+" if total > 0 else "-")
                if op is None:
                    return []
                return [op, self.replace_node(expr.right, str(abs(total)))]
        text = self.text(expr)
        # `expr + 1` must still parse as (expr) + 1: bitwise operators, comparisons,
        # boolean operators, conditionals and lambdas bind more loosely than `+`
        arithmetic = isinstance(expr, ast.BinOp) and not isinstance(expr.op, _LOOSE_BINOPS)
        if not isinstance(expr, _ADDITIVE_SAFE) and not arithmetic:
            text = f"({text})"
        sign = "+" if delta > 0 else "-"
        return [self.replace_node(expr, f"{text} {sign} {abs(delta)}")]

    def apply(self, patches: list[Patch]) -> str:
        """The code with non-overlapping ``patches`` applied."""
        out = self.code
        for patch in sorted(patches, key=lambda p: p.start, reverse=True):
            out = out[: patch.start] + patch.new + out[patch.end :]
        return out

"""Tests of the AST mutation operators."""

import ast

import pytest

from nip_core.scenarios.code_validation.dataset.mutations import MUTATION_OPERATORS, generate_mutants

OPERATORS = {op.name: op for op in MUTATION_OPERATORS}


def mutants(code: str, operator: str) -> list[tuple[str, str]]:
    """(description, code) of the mutants of ``code`` by one operator."""
    return [(m.description, m.code) for m in generate_mutants(code, (OPERATORS[operator],))]


def codes(code: str, operator: str) -> list[str]:
    return [c for _, c in mutants(code, operator)]


def test_comparison_flip_changes_only_the_operator():
    code = "if a < b:  # strict\n    print('lt')\n"
    assert mutants(code, "comparison_flip") == [
        ("line 1: comparison `<` changed to `<=`", "if a <= b:  # strict\n    print('lt')\n")
    ]
    assert codes("ok = x >= y != z\n", "comparison_flip") == ["ok = x > y != z\n", "ok = x >= y == z\n"]


def test_range_off_by_one_shifts_end_and_start():
    code = "for i in range(1, n):\n    pass\n"
    assert codes(code, "range_off_by_one") == [
        "for i in range(1, n + 1):\n    pass\n",
        "for i in range(1, n - 1):\n    pass\n",
        "for i in range(2, n):\n    pass\n",
        "for i in range(0, n):\n    pass\n",
    ]
    # `n - 1` shifted by one folds back to `n` instead of `n - 1 + 1`
    assert codes("for i in range(n - 1):\n    pass\n", "range_off_by_one") == [
        "for i in range(n):\n    pass\n",
        "for i in range(n - 2):\n    pass\n",
    ]


def test_index_off_by_one_on_indices_and_slices():
    assert codes("x = a[i - 1]\n", "index_off_by_one") == ["x = a[i]\n", "x = a[i - 2]\n"]
    assert codes("x = a[-1]\n", "index_off_by_one") == ["x = a[0]\n", "x = a[-2]\n"]
    assert codes("x = s[:k]\n", "index_off_by_one") == ["x = s[:k + 1]\n", "x = s[:k - 1]\n"]
    # dictionary look-ups by a literal key are not indices
    assert codes("x = d['key']\n", "index_off_by_one") == []


def test_constant_off_by_one_in_arithmetic_and_comparisons():
    assert codes("y = x * 10 + 3\n", "constant_off_by_one") == [
        "y = x * 10 + 4\n",
        "y = x * 10 + 2\n",
        "y = x * 11 + 3\n",
        "y = x * 9 + 3\n",
    ]
    assert codes("if n < 1:\n    pass\n", "constant_off_by_one") == [
        "if n < 2:\n    pass\n",
        "if n < 0:\n    pass\n",
    ]
    # `x - 0` is not a plausible slip; plain assignments belong to wrong_initial_value
    assert codes("y = x - 1\nz = 5\n", "constant_off_by_one") == ["y = x - 2\nz = 5\n"]


def test_arithmetic_swap_on_binary_and_augmented_operators():
    assert codes("s += a - b\n", "arithmetic_swap") == ["s -= a - b\n", "s += a + b\n"]
    assert codes("q = n // 10 % 7\n", "arithmetic_swap") == ["q = n // 10 // 7\n", "q = n % 10 % 7\n"]
    # string formatting is not arithmetic
    assert codes("t = '%d' % n\n", "arithmetic_swap") == []


def test_boolean_swap():
    assert mutants("ok = a and b and c\n", "boolean_swap") == [
        ("line 1: boolean `and` changed to `or`", "ok = a or b or c\n")
    ]


def test_min_max_swap():
    assert codes("best = max(best, min(x, y))\n", "min_max_swap") == [
        "best = min(best, min(x, y))\n",
        "best = max(best, max(x, y))\n",
    ]


def test_drop_else_removes_the_else_block_but_not_elif():
    code = "if x:\n    y = 1\nelse:\n    # fallback\n    y = 2\nprint(y)\n"
    assert mutants(code, "drop_else") == [
        ("line 3: `else` branch of the `if` on line 1 removed", "if x:\n    y = 1\nprint(y)\n")
    ]
    assert codes("if x:\n    y = 1\nelif z:\n    y = 2\n", "drop_else") == []


def test_break_continue_swap():
    code = "for x in a:\n    if x:\n        break\n    continue\n"
    assert codes(code, "break_continue_swap") == [
        "for x in a:\n    if x:\n        break\n    break\n",
        "for x in a:\n    if x:\n        continue\n    continue\n",
    ]


def test_early_return_value_changes_guard_returns_only():
    code = "def f(n):\n    if n < 2:\n        return False\n    return True\n"
    assert codes(code, "early_return_value") == [
        "def f(n):\n    if n < 2:\n        return True\n    return True\n"
    ]
    assert codes("def g(n):\n    if n == 0:\n        return 1\n    return n\n", "early_return_value") == [
        "def g(n):\n    if n == 0:\n        return 2\n    return n\n",
        "def g(n):\n    if n == 0:\n        return 0\n    return n\n",
    ]


def test_wrong_initial_value():
    assert mutants("count = 0\n", "wrong_initial_value") == [
        ("line 1: `count` initialised to `1` instead of `0`", "count = 1\n")
    ]
    assert codes("best = -1\n", "wrong_initial_value") == ["best = 0\n"]
    assert codes("k = 5\n", "wrong_initial_value") == ["k = 6\n", "k = 4\n"]


def test_sort_order_flip():
    assert codes("b = sorted(a)\n", "sort_order_flip") == ["b = sorted(a, reverse=True)\n"]
    assert codes("a.sort(key=len, reverse=True)\n", "sort_order_flip") == ["a.sort(key=len)\n"]
    assert codes("a.sort(reverse=True, key=len)\n", "sort_order_flip") == ["a.sort(key=len)\n"]
    assert codes("a.sort()\n", "sort_order_flip") == []


def test_mutants_keep_formatting_comments_and_quotes():
    code = (
        "# header comment\n"
        "n = int(input())  # count\n"
        "\n"
        'label = "total"\n'
        "total = 0\n"
        "for i in range(n):\n"
        "    total += i\n"
        'print(label, total)\n'
    )
    all_mutants = generate_mutants(code)
    assert [m.operator for m in all_mutants] == [
        "range_off_by_one",
        "range_off_by_one",
        "arithmetic_swap",
        "wrong_initial_value",
    ]
    for mutant in all_mutants:
        assert mutant.code.startswith("# header comment\nn = int(input())  # count\n\n")
        assert 'label = "total"' in mutant.code
        changed = [a != b for a, b in zip(code.splitlines(), mutant.code.splitlines())]
        assert sum(changed) <= 1 or mutant.operator == "drop_else"


def test_every_mutant_parses_differs_and_is_deterministic():
    code = (
        "def solve(a):\n"
        "    best = 0\n"
        "    for i in range(1, len(a)):\n"
        "        if a[i] > a[i - 1] and a[i] % 2 == 0:\n"
        "            best = max(best, a[i] - a[i - 1])\n"
        "        else:\n"
        "            continue\n"
        "    return best\n"
        "print(solve(sorted(map(int, input().split()))))\n"
    )
    first = generate_mutants(code)
    second = generate_mutants(code)
    assert first == second
    texts = [m.code for m in first]
    assert len(texts) == len(set(texts))
    assert code not in texts
    original = ast.dump(ast.parse(code))
    for mutant in first:
        assert ast.dump(ast.parse(mutant.code)) != original
    assert {m.operator for m in first} >= {
        "comparison_flip",
        "range_off_by_one",
        "index_off_by_one",
        "constant_off_by_one",
        "arithmetic_swap",
        "boolean_swap",
        "min_max_swap",
        "drop_else",
        "break_continue_swap",
        "wrong_initial_value",
        "sort_order_flip",
    }


def test_non_ascii_source_positions_are_handled():
    code = "s = 'héllo'; n = len(s) - 1\nprint(s[n])\n"
    assert codes(code, "index_off_by_one") == [
        "s = 'héllo'; n = len(s) - 1\nprint(s[n + 1])\n",
        "s = 'héllo'; n = len(s) - 1\nprint(s[n - 1])\n",
    ]


@pytest.mark.parametrize("operator", sorted(OPERATORS))
def test_operators_ignore_code_without_sites(operator):
    assert codes("print('hello')\n", operator) == []

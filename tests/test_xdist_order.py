"""The parallel suite's order: whole modules per worker, long tests first, slices of xdist's sizes."""

from __future__ import annotations

import pytest

from tests.xdist_order import Timed, deal, timed, xdist_cuts


def _suite() -> tuple[list[str], list[Timed]]:
    """A suite shaped like this one: a few long and end-to-end modules, a big slow module of
    small parametrised tests, many short modules."""
    spec = [("e2e/deploy", [timed("e2e/deploy", 215, True, True), timed("e2e/deploy", 180, True, True)]),
            ("learning", [timed("learning", 320, False, True)]),
            ("e2e/browser", [timed("e2e/browser", None, True, True)] * 2
             + [timed("e2e/browser", 130, True, True)]),
            ("llm_api", [timed("llm_api", None, True, True)] * 21),
            ("fields", [timed("fields", None, False, True)] * 150 + [timed("fields", None, False, False)] * 60),
            *[(f"unit{k}", [timed(f"unit{k}", None, False, False)] * (3 + k % 7)) for k in range(40)]]
    names = [f"{module}::t{i}" for module, tests in spec for i in range(len(tests))]
    return names, [t for _, tests in spec for t in tests]


def _slices(order: list[str], workers: int) -> list[list[str]]:
    out, start = [], 0
    for size in xdist_cuts(len(order), workers):
        out.append(order[start:start + size])
        start += size
    return out


def test_xdist_cuts_are_the_first_dealing_of_work_stealing():
    # xdist's WorkStealingScheduling sends len(pending) // nodes_remaining to each idle node in turn
    assert xdist_cuts(7, 2) == [3, 4]
    assert xdist_cuts(10, 3) == [3, 3, 4]
    assert xdist_cuts(2174, 2) == [1087, 1087]
    assert sum(xdist_cuts(1001, 4)) == 1001


@pytest.mark.parametrize("workers", [2, 3])
def test_every_test_once_and_each_module_on_one_worker_where_it_fits(workers):
    names, info = _suite()
    order = deal(names, info, workers)
    assert sorted(order) == sorted(names)
    slices = _slices(order, workers)
    modules = {t.module for t in info}
    on = {m: [k for k, s in enumerate(slices) if any(n.startswith(f"{m}::") for n in s)] for m in modules}
    # every module that has a long, end-to-end or slow test runs on one worker only (but
    # "fields": its 210 tests do not fit in a third of the 472, and are cut where a slice is full)
    heavy = {t.module for t in info if t.kind < 3 and t.module != "fields"}
    assert all(len(on[m]) == 1 for m in heavy), {m: on[m] for m in heavy}
    # a module is cut only where a slice is full: at most one per boundary between slices
    assert sum(len(ks) - 1 for ks in on.values()) <= workers - 1


def test_each_worker_starts_with_its_long_tests_and_ends_with_short_ones():
    names, info = _suite()
    kind = dict(zip(names, (t.kind for t in info)))
    heavy = {t.module for t in info if t.kind < 3}
    long = {t.module for t in info if t.kind == 0}
    for s in _slices(deal(names, info, 2), 2):
        assert s[0].split("::")[0] in long and kind[s[-1]] == 3
        in_heavy = [n.split("::")[0] in heavy for n in s]
        assert in_heavy == sorted(in_heavy, reverse=True)  # the modules of short tests only come last


def test_the_estimated_load_is_balanced_within_the_largest_module():
    names, info = _suite()
    seconds = dict(zip(names, (t.seconds for t in info)))
    loads = [sum(seconds[n] for n in s) for s in _slices(deal(names, info, 2), 2)]
    biggest = max(sum(t.seconds for t in info if t.module == m) for m in {t.module for t in info})
    assert abs(loads[0] - loads[1]) <= biggest, loads


def test_one_worker_runs_long_tests_first_in_collection_order_otherwise():
    names, info = _suite()
    order = deal(names, info, 1)
    kinds = [info[names.index(n)].kind for n in order]
    assert kinds == sorted(kinds)
    assert [n for n in order if n.startswith("unit3::")] == [n for n in names if n.startswith("unit3::")]

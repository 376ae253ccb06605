"""The order the parallel suite runs in (used by ``tests/conftest.py``), as a pure function.

``scripts/run_tests.sh`` runs the suite with xdist's work stealing. Its first dealing gives
the workers contiguous slices of the collection order: worker ``i`` takes
``len(rest) // (workers - i)`` of the items left (:func:`xdist_cuts`). An idle worker then
takes the second half of the longest queue left, i.e. its tail.

:func:`deal` writes one slice per worker, so that:

* a module is not cut between workers (except where a slice is full: the sizes are xdist's),
  so that its module-scoped fixtures (a PostgreSQL-backed Prefect server, a browser, a
  model) are set up once, not once per worker that gets a part of it;
* the modules with long, end-to-end or slow tests are spread over the slices by their
  estimated time, longest first (each to the least loaded slice);
* each slice runs its long tests first and its short tests last, so that what a worker
  steals at the end is short.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Sequence, TypeVar

T = TypeVar("T")

#: estimated seconds of a test by its kind, where no ``long(seconds)`` marker says more
E2E_S, SLOW_S, FAST_S = 60.0, 5.0, 0.3


@dataclass(frozen=True)
class Timed:
    """What the dealing needs to know of one collected test."""

    module: Hashable
    kind: int  # 0 long, 1 end-to-end, 2 slow, 3 other
    seconds: float  # estimated


def timed(module: Hashable, long_s: float | None, e2e: bool, slow: bool) -> Timed:
    if long_s is not None:
        return Timed(module, 0, float(long_s))
    if e2e:
        return Timed(module, 1, E2E_S)
    if slow:
        return Timed(module, 2, SLOW_S)
    return Timed(module, 3, FAST_S)


def xdist_cuts(total: int, workers: int) -> list[int]:
    """The sizes of the contiguous slices xdist's work stealing first sends to each worker."""
    sizes, left = [], total
    for i in range(workers):
        size = left // (workers - i)
        sizes.append(size)
        left -= size
    return sizes


def deal(items: Sequence[T], info: Sequence[Timed], workers: int) -> list[T]:
    """``items`` reordered into one slice per worker (see the module's docstring)."""
    if workers <= 1 or not items:
        return [items[i] for i in sorted(range(len(items)), key=lambda i: info[i].kind)]
    modules: dict[Hashable, list[int]] = {}
    for i, t in enumerate(info):
        modules.setdefault(t.module, []).append(i)

    def unit_key(indices: list[int]) -> tuple[int, float]:
        """A module's place: its heaviest kind of test, then its estimated time, longest first."""
        return (min(info[i].kind for i in indices), -sum(info[i].seconds for i in indices))

    units = list(modules.values())
    heavy = sorted((u for u in units if unit_key(u)[0] < 3), key=lambda u: unit_key(u)[1])
    light = [i for u in units if unit_key(u)[0] == 3 for i in u]  # collection order
    sizes = xdist_cuts(len(items), workers)
    parts: list[list[list[int]]] = [[] for _ in range(workers)]
    taken, load = [0] * workers, [0.0] * workers
    for unit in heavy:  # longest first, each to the least loaded slice with room
        rest = unit
        while rest:  # a module larger than the room left is cut
            w = min((k for k in range(workers) if taken[k] < sizes[k]), key=lambda k: (load[k], k))
            part, rest = rest[:sizes[w] - taken[w]], rest[sizes[w] - taken[w]:]
            parts[w].append(part)
            taken[w] += len(part)
            load[w] += sum(info[i].seconds for i in part)
    order: list[int] = []
    for w in range(workers):  # in each slice: long, end-to-end, slow modules, then short tests
        order += [i for part in sorted(parts[w], key=unit_key) for i in part]
        order += light[:sizes[w] - taken[w]]
        del light[:sizes[w] - taken[w]]
    return [items[i] for i in order]

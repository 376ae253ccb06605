"""Progress bars whose totals are known up front (``attach_progress_bar``).

A trainer method decorated with ``@attach_progress_bar(lambda self: n)`` receives an
``iteration_context`` keyword argument: a tqdm bar (quiet when stderr is not a TTY,
unless forced) that also forwards every step to the trainer's hooks, so an
orchestrator can mirror progress (e.g. as a Prefect progress artifact) without
nip_core knowing about it. ``Trainer.get_total_num_iterations`` sums the totals.
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable

from tqdm.auto import tqdm


def progress_enabled(setting: bool | None) -> bool:
    if setting is not None:
        return setting
    return bool(getattr(sys.stderr, "isatty", lambda: False)())


class IterationContext:
    """A progress bar for one loop of known length."""

    def __init__(self, total: int, description: str = "", enabled: bool = False,
                 on_step: Callable[[int, int, str], None] | None = None, initial: int = 0):
        self.total = total
        self.count = initial
        self.description = description
        self._on_step = on_step
        self._bar = tqdm(total=total, initial=initial, desc=description, disable=not enabled,
                         dynamic_ncols=True, leave=True)

    def set_description(self, description: str) -> None:
        self.description = description
        self._bar.set_description(description)

    def set_postfix(self, **values: Any) -> None:
        self._bar.set_postfix(**values)

    def step(self, n: int = 1) -> None:
        self.count += n
        self._bar.update(n)
        if self._on_step is not None:
            self._on_step(self.count, self.total, self.description)

    def close(self) -> None:
        self._bar.close()

    def __enter__(self) -> "IterationContext":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def attach_progress_bar(total_fn: Callable[[Any], int], description: str = ""):
    """Decorate a trainer method so it runs inside an :class:`IterationContext`.

    Parameters
    ----------
    total_fn
        ``total_fn(self)`` returns the number of steps the method will take.
    description
        Initial description of the bar.
    """

    def decorator(method):
        @functools.wraps(method)
        def wrapper(self, *args, **kwargs):
            if "iteration_context" in kwargs:
                return method(self, *args, **kwargs)
            total = int(total_fn(self))
            with self.make_iteration_context(total, description or method.__name__.strip("_")) as ctx:
                return method(self, *args, iteration_context=ctx, **kwargs)

        wrapper._progress_total_fn = total_fn  # type: ignore[attr-defined]
        return wrapper

    return decorator


def total_iterations(obj: Any) -> int:
    """Sum of the totals of every ``attach_progress_bar`` method of ``obj``'s class."""
    total = 0
    for name in dir(type(obj)):
        fn = getattr(type(obj), name, None)
        total_fn = getattr(fn, "_progress_total_fn", None)
        if total_fn is not None:
            total += int(total_fn(obj))
    return total

"""Callbacks through which an orchestrator (or a test) observes a trainer (no dependency on it).

Two ways in:

* per trainer: the ``hooks`` object a trainer is built with (:class:`TrainerHooks` or a
  subclass; the Prefect flows pass theirs);
* per process: :func:`register_point_hook` adds a :class:`TrainerHooks` whose
  :meth:`~TrainerHooks.at_point` every trainer of the process calls, after its own hooks.
  This is how a process that builds its trainers itself (a flow run, a driver script)
  lets a caller observe them without reaching into their construction: the resume tests
  register a hook that SIGKILLs the process at a chosen point.

Stage points
------------
A pure-text trainer reports ``(iteration, stage, point)`` at these points of its stages
(:func:`reach_point`): ``start`` and ``end`` of every stage (``end``: the stage summary
and the state are written), ``before_save`` in ``sample_rollouts`` (rollouts sampled, not
yet written) and ``after_<group>`` in ``create_fine_tune_jobs`` (that group's job created
and its id saved in the state, the next group's not yet).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

__all__ = ["TrainerHooks", "point_hooks", "reach_point", "register_point_hook"]


class TrainerHooks:
    """No-op base: subclass and override what you need (the Prefect flows do)."""

    def on_progress(self, count: int, total: int, description: str) -> None:
        """A progress bar advanced."""

    def on_iteration_end(self, iteration: int, metrics: dict[str, Any]) -> None:
        """An iteration's metrics were logged."""

    def on_stage_end(self, stage: str, iteration: int) -> None:
        """A pure-text stage finished and the state was saved."""

    def at_point(self, iteration: int, stage: str, point: str) -> None:
        """The trainer reached ``point`` of ``stage`` in ``iteration`` (see the module docs)."""


_POINT_HOOKS: list[TrainerHooks] = []
_LOCK = threading.Lock()


def register_point_hook(hooks: TrainerHooks) -> Callable[[], None]:
    """Have every trainer of this process call ``hooks.at_point`` at its stage points.

    Returns
    -------
    Callable[[], None]
        Removes ``hooks`` again (a no-op if it is gone already).
    """
    if not isinstance(hooks, TrainerHooks):
        raise TypeError(f"register_point_hook expects a TrainerHooks, got {type(hooks).__name__}")
    with _LOCK:
        _POINT_HOOKS.append(hooks)

    def unregister() -> None:
        with _LOCK:
            if hooks in _POINT_HOOKS:
                _POINT_HOOKS.remove(hooks)

    return unregister


def point_hooks() -> tuple[TrainerHooks, ...]:
    """The process-wide point hooks, in registration order."""
    with _LOCK:
        return tuple(_POINT_HOOKS)


def reach_point(hooks: TrainerHooks, iteration: int, stage: str, point: str) -> None:
    """Report a stage point to a trainer's own ``hooks``, then to the process-wide ones."""
    hooks.at_point(iteration, stage, point)
    for extra in point_hooks():
        extra.at_point(iteration, stage, point)

"""The trainer a task works on, opened from the serialisable run spec the task receives.

Every task of a run takes a *spec* (:class:`RunSpecLike`, in practice
:class:`flows.parameters.RunSpec`: the run's hyper-parameters and settings, its run id
among them, and the parent's lease claim) and a position (iteration, stage or block),
never a live trainer. :func:`task_trainer` gives the task its trainer:

* **rebuilt from the run store** (the general case): the registered trainer is built
  from the spec, opens the run, joins the parent's lease claim when the spec carries
  one, and is closed when the task ends. Every task starts from what the run store
  says (a stage re-reads the state, a block restores the latest checkpoint), so this
  trainer computes exactly what any other would.
* **the flow's own trainer** (an optimisation): a flow that built a trainer for the
  run in this process registers it with :func:`keep_trainer`; the tasks it calls in
  this process then use that object instead of building another (building one costs a
  dataset, agents and a W&B run). Correctness does not depend on it, for the reason
  above: the cache is keyed by ``(run_id, params_hash)`` and only ever saves the
  rebuilding; a task that misses it (another process, a retried block after
  :func:`forget_trainer`) rebuilds and gets the same result.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from nip_core.parameters import HyperParameters
from nip_core.settings import ExperimentSettings

__all__ = ["RunSpecLike", "forget_trainer", "keep_trainer", "kept_trainer", "release_trainer", "spec_key",
           "task_trainer"]


class RunSpecLike(Protocol):
    """What a task needs of a run spec (:class:`flows.parameters.RunSpec` implements it)."""

    settings: dict[str, Any]
    lease: dict[str, Any] | None

    def hyper_params(self) -> HyperParameters: ...

    def experiment_settings(self) -> ExperimentSettings: ...


# Trainers the flows of this process built, by (run_id, params_hash); see the module docs.
_KEPT: dict[tuple[str, str], Any] = {}
_LOCK = threading.Lock()


def spec_key(spec: RunSpecLike) -> tuple[str, str]:
    """``(run_id, params_hash)`` of ``spec``'s run (the key of its results and of the cache)."""
    run_id = spec.settings.get("run_id")
    if not run_id:
        raise ValueError("spec.settings.run_id: a task needs the id of a run in the run store")
    return str(run_id), spec.hyper_params().params_hash()


def keep_trainer(spec: RunSpecLike, trainer: Any) -> None:
    """Let this process's tasks of ``spec``'s run use ``trainer`` instead of rebuilding one."""
    with _LOCK:
        _KEPT[spec_key(spec)] = trainer


def forget_trainer(spec: RunSpecLike) -> None:
    """Drop the kept trainer of ``spec``'s run (the next task rebuilds one)."""
    with _LOCK:
        _KEPT.pop(spec_key(spec), None)


def release_trainer(trainer: Any) -> None:
    """Drop ``trainer`` wherever it is kept (its flow is done with it, e.g. closed it)."""
    with _LOCK:
        for key in [k for k, v in _KEPT.items() if v is trainer]:
            del _KEPT[key]


def kept_trainer(spec: RunSpecLike) -> Any | None:
    """The trainer kept for ``spec``'s run in this process, if any."""
    with _LOCK:
        return _KEPT.get(spec_key(spec))


@contextmanager
def task_trainer(spec: RunSpecLike) -> Iterator[Any]:
    """The trainer of ``spec``'s run for the body of a task (kept, or rebuilt and closed after)."""
    kept = kept_trainer(spec)
    if kept is not None:
        yield kept
        return
    from nip_core.trainers import build_trainer  # torch and the trainers: when a task first needs one

    trainer = build_trainer(spec.hyper_params(), spec.experiment_settings())
    lock = trainer.run.lock
    if spec.lease and not lock.held:  # work under the parent's claim: writes check it
        lock.join(str(spec.lease["owner"]), int(spec.lease["generation"]))
        joined = True
    else:
        joined = False
    try:
        trainer.reload_state()
        yield trainer
    finally:
        try:
            if joined:
                lock.release()
        finally:
            trainer.close()

"""The RL block: a range of TensorDict RL iterations as one cached Prefect task.

``TensorDictRlTrainer.run_iterations(start, stop)`` restores the latest checkpoint from
the run store, trains iterations ``[start, stop)`` and checkpoints at the end, so a
block is a pure function of the previous block's checkpoint: retrying it (or running it
on another machine) gives the same parameters as an uninterrupted run. The tasks receive
the run's spec (serialisable), not a trainer: see :mod:`tasks.trainers`.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field
from prefect import task

from tasks.persistence import task_options_for
from tasks.trainers import RunSpecLike, task_trainer


class Block(BaseModel):
    """Iterations ``[start, stop)`` of a run, numbered from 0."""

    index: int = Field(ge=0)
    start: int = Field(ge=0)
    stop: int = Field(ge=0)


def plan_blocks(num_iterations: int, block_size: int) -> list[Block]:
    """Split ``num_iterations`` into consecutive blocks of at most ``block_size``.

    >>> [(b.start, b.stop) for b in plan_blocks(5, 2)]
    [(0, 2), (2, 4), (4, 5)]
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    return [Block(index=i, start=s, stop=min(s + block_size, num_iterations))
            for i, s in enumerate(range(0, num_iterations, block_size))]


@task(name="train_iterations", task_run_name="train_iterations[{start}:{stop}]", tags=["gpu"])
def train_iterations(spec: RunSpecLike, block: int, start: int, stop: int) -> dict[str, Any]:
    """Train iterations ``[start, stop)`` of ``spec``'s run from the latest checkpoint (thin call)."""
    with task_trainer(spec) as trainer:
        trainer.run_iterations(start, stop)
        flush = getattr(trainer.hooks, "flush", None)
        if callable(flush):  # publish the block's metrics before the block's flow run ends
            flush()
        return {"block": block, "start": start, "stop": stop, "iteration": int(trainer.state.iteration)}


def run_block_task(spec: RunSpecLike, block: Block, *, return_state: bool = False):
    """Run ``train_iterations`` cached by ``(run_id, params_hash, block)`` (inside a flow)."""
    key = lambda inputs: (f"block{inputs['block']}", f"{inputs['start']}-{inputs['stop']}")  # noqa: E731
    bound = train_iterations.with_options(**task_options_for(spec, key))
    return bound(spec, block.index, block.start, block.stop, return_state=return_state)


@task(name="test_loop", task_run_name="test_loop[{run_id}]", tags=["gpu"])
def test_loop(spec: RunSpecLike, run_id: str) -> dict[str, Any]:
    """The final test loop of a TensorDict trainer (thin call).

    The trainer first loads the latest checkpoint: the blocks may have been trained by
    other processes (deployed) or by another trainer object (a retried block).
    """
    with task_trainer(spec) as trainer:
        if callable(getattr(trainer, "restore_latest_checkpoint", None)):
            trainer.restore_latest_checkpoint()
        if callable(getattr(trainer, "run_test_loop", None)):
            trainer.run_test_loop()
        else:
            trainer.test()
        return {"run_id": run_id, "tested_at_iteration": int(trainer.state.iteration)}


def run_test_loop_task(spec: RunSpecLike, num_iterations: int):
    """Run the test loop once per run, cached by ``(run_id, params_hash, "test")``."""
    bound = test_loop.with_options(**task_options_for(spec, lambda inputs: ("test", f"after{num_iterations}")))
    return bound(spec, str(spec.settings["run_id"]))

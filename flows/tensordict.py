"""``tensordict_training``: TensorDict RL iterations in GPU-tagged blocks.

The iterations ``[0, num_iterations)`` are split into blocks of ``block_size``. Each
block is its own flow run, ``rl_iteration_block``, tagged ``gpu`` (so the ``gpu`` tag
concurrency limit keeps two experiments' blocks off one GPU) and retried by Prefect on
failure. Inside it, the task ``train_iterations`` is cached by
``(run_id, params_hash, block)``: a re-run of the experiment skips finished blocks, and a
retried block restarts from the previous block's checkpoint, which is what
``run_iterations`` restores, so the result equals an uninterrupted run's.

Locally a block is a subflow in the same process; deployed, it runs through
``run_deployment`` on the ``nipflow-gpu`` pool (deployment ``rl_iteration_block/rl-block``).
"""

from __future__ import annotations

import os
from typing import Any, Literal

from prefect import flow, get_run_logger, tags

from flows.parameters import ExperimentParameters, RunSpec
from flows.leases import driving
from tasks.rl_block import Block, plan_blocks, run_block_task

BLOCK_DEPLOYMENT = "rl_iteration_block/rl-block"
BlockDispatch = Literal["auto", "subflow", "deployment"]


class BlockFailedError(RuntimeError):
    """A deployed RL block flow run did not complete (names the run and block)."""


@flow(name="rl_iteration_block", flow_run_name="rl-block-{block.index}[{block.start}:{block.stop}]",
      retries=2, retry_delay_seconds=1, persist_result=True)
def rl_iteration_block(spec: RunSpec, block: Block) -> dict[str, Any]:
    """Train one block of iterations of the run described by ``spec``."""
    from prefect.runtime import flow_run

    from flows.experiment import forget_trainer, trainer_from_spec

    device = os.environ.get("NIPFLOW_DEVICE")  # set by the GPU pool's job variables
    if device and spec.settings.get("device") != device:
        spec = spec.model_copy(update={"settings": {**spec.settings, "device": device}})
    if flow_run.run_count > 1:
        # A retry must start from the previous block's checkpoint, not from the
        # half-trained models the failed attempt left in this process's trainer.
        forget_trainer(spec)
    trainer = trainer_from_spec(spec)
    with driving(trainer, spec.lease):
        return run_block_task(trainer, block)


def _dispatch_block(spec: RunSpec, block: Block, deployed: bool) -> dict[str, Any]:
    with tags("gpu"):
        if not deployed:
            return rl_iteration_block(spec, block)
    from prefect.deployments import run_deployment

    child = run_deployment(BLOCK_DEPLOYMENT, parameters={"spec": spec.model_dump(mode="json"),
                                                         "block": block.model_dump()},
                           tags=["gpu"], timeout=None, poll_interval=5)
    if not child.state or not child.state.is_completed():
        raise BlockFailedError(f"RL block {block.index} [{block.start}:{block.stop}) of run "
                               f"{spec.settings.get('run_id')}: flow run {child.id} ended "
                               f"{child.state.name if child.state else 'without a state'}")
    # Not child.state.result(): flow results live in the worker's PREFECT_HOME, which
    # another machine cannot read; the block's checkpoint in the shared run store counts.
    return {"block": block.index, "start": block.start, "stop": block.stop, "iteration": block.stop,
            "flow_run_id": str(child.id)}


def drive_blocks(trainer: Any, spec: RunSpec, block_size: int, dispatch: BlockDispatch = "auto") -> list[dict]:
    """Run every block of ``trainer``'s run in order (finished blocks come back cached)."""
    from prefect.runtime import deployment

    deployed = dispatch == "deployment" or (dispatch == "auto" and deployment.id is not None)
    results = []
    for block in plan_blocks(trainer.hyper_params.rl.num_iterations, block_size):
        results.append(_dispatch_block(spec, block, deployed))
        get_run_logger().info("run %s: block %d [%d:%d) done", spec.settings.get("run_id"),
                              block.index, block.start, block.stop)
    return results


@flow(name="tensordict_training", persist_result=True)
def tensordict_training(parameters: ExperimentParameters, dispatch: BlockDispatch = "auto") -> dict[str, Any]:
    """Train a TensorDict RL trainer block by block; then run its test loop."""
    from flows.experiment import open_trainer

    trainer = open_trainer(parameters)
    try:
        return run_tensordict(trainer, parameters.block_size, dispatch)
    finally:
        trainer.close()


def run_tensordict(trainer: Any, block_size: int, dispatch: BlockDispatch = "auto") -> dict[str, Any]:
    from flows.experiment import remember_trainer
    from flows.observability import write_summary

    spec = RunSpec.of(trainer.hyper_params, trainer.settings).model_copy(update={"lease": trainer.run.lock.claim()})
    remember_trainer(trainer)  # local subflows reuse this trainer instead of building another
    blocks = drive_blocks(trainer, spec, block_size, dispatch)
    if callable(getattr(trainer, "run_test_loop", None)) or (
            callable(getattr(trainer, "test", None)) and trainer.hyper_params.rl.num_test_iterations > 0):
        from tasks.rl_block import run_test_loop_task

        run_test_loop_task(trainer, trainer.hyper_params.rl.num_iterations)
    write_summary(trainer)
    return {"run_id": trainer.run.run_id, "blocks": len(blocks),
            "iteration": blocks[-1]["iteration"] if blocks else 0, "location": trainer.run.location}

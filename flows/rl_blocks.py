"""TensorDict RL iterations in GPU-tagged blocks, inside the ``train_experiment`` flow run.

``train_experiment`` (:mod:`flows.experiment`) trains a TensorDict RL trainer with
:func:`run_tensordict`. The iterations ``[0, num_iterations)`` are split into blocks of
``block_size``. Each block is its own flow run, ``rl_iteration_block``, tagged ``gpu`` (so
the ``gpu`` tag concurrency limit keeps two experiments' blocks off one GPU) and retried
by Prefect on failure. Inside it, the task ``train_iterations`` is cached by
``(run_id, params_hash, block)``: a re-run of the experiment skips finished blocks, and a
retried block restarts from the previous block's checkpoint, which is what
``run_iterations`` restores, so the result equals an uninterrupted run's.

Locally a block is a subflow in the same process; deployed, it runs through
``run_deployment`` on the ``nipflow-gpu`` pool (deployment ``rl_iteration_block/rl-block``).

The device of a block is a flow parameter like everything else about the run: the
parent's ``parameters.device`` travels in ``spec.settings["device"]`` (``"auto"`` by
default) and the block resolves it on the host it runs on (CUDA when that host has it,
else the CPU). Nothing else sets it: neither the work pool's job variables nor the
worker's environment.
"""

from __future__ import annotations

import contextlib
import time
from typing import Annotated, Any, Literal, Optional

from prefect import flow, get_run_logger, tags
from prefect.deployments import run_deployment
from prefect.runtime import deployment, flow_run
from pydantic import AfterValidator, Field

from flows.leases import driving
from flows.observability import PrefectHooks
from flows.parameters import MissingParameterError, RunSpec
from flows.signals import Preempted
from flows.trainer_access import check_device_here, forget_trainer, remember_trainer, trainer_from_spec
from nip_core.errors import TrainingPreempted
from tasks.rl_block import Block, plan_blocks, run_block_task, run_test_loop_task

BLOCK_DEPLOYMENT = "rl_iteration_block/rl-block"
BLOCK_FLOW = "rl_iteration_block"
BlockDispatch = Literal["auto", "subflow", "deployment"]


class BlockFailedError(RuntimeError):
    """A deployed RL block flow run did not complete (names the run and block)."""


# The checks of a block's parameters run while Prefect validates them, not in the body.
# In Prefect 3.8.8 a flow's retries are the server's RetryFailedFlows rule: *every*
# Running -> Failed transition of a flow run with retries left becomes AwaitingRetry, and
# the engine runs the body again (flows have no retry_condition_fn, and the exception
# type does not matter; a BaseException would end the run Crashed instead, which the
# nipflow automation reschedules, worse). The engine validates the parameters in
# begin_run, *before* it proposes Running: a validator that raises fails the run
# Pending -> Failed, which that rule does not see, so no retry is spent, and the body
# never starts (nothing is built). A missing parameter or a CUDA device this host does
# not have cannot be fixed by running again on the same host, so both fail here. The
# error propagates as it is (not a ValueError, so pydantic does not wrap it): a local
# subflow raises it in the parent; a deployed block's state message carries it.


def _checked_spec(spec: Optional[RunSpec]) -> RunSpec:
    if spec is None:
        raise MissingParameterError(BLOCK_FLOW, "spec", "the RunSpec of a run, which train_experiment passes "
                                    "to every block it starts")
    spec.require_complete(BLOCK_FLOW)
    check_device_here(spec.device, "parameters.device")  # on the host (and pool) that would train
    return spec


def _checked_block(block: Optional[Block]) -> Block:
    if block is None:
        raise MissingParameterError(BLOCK_FLOW, "block", 'the iterations to train, e.g. '
                                    '{"index": 0, "start": 0, "stop": 10}')
    return block


# Optional with default None in the parameter schema (a deployment form can be saved
# with no value); ``validate_default`` runs the check on the default too.
SpecParameter = Annotated[Optional[RunSpec], AfterValidator(_checked_spec), Field(validate_default=True)]
BlockParameter = Annotated[Optional[Block], AfterValidator(_checked_block), Field(validate_default=True)]


def _block_run_name() -> str:
    """``rl-block-<index>[<start>:<stop>]`` (the name is made after the parameters validated)."""
    block = flow_run.parameters.get("block")
    if isinstance(block, dict):
        block = Block.model_validate(block)
    if not isinstance(block, Block):
        return "rl-block"
    return f"rl-block-{block.index}[{block.start}:{block.stop}]"


@flow(name=BLOCK_FLOW, flow_run_name=_block_run_name, retries=2, retry_delay_seconds=1, persist_result=True)
def rl_iteration_block(spec: SpecParameter = None, block: BlockParameter = None) -> dict[str, Any]:
    """Train one block of iterations of the run described by ``spec``.

    Both parameters are required in fact (a missing one fails the run before it starts,
    naming it); ``spec.settings["device"]`` is resolved on this host.
    """
    if flow_run.run_count > 1:
        # A retry must start from the previous block's checkpoint, not from the
        # half-trained models the failed attempt left in this process's trainer.
        forget_trainer(spec)
    trainer = trainer_from_spec(spec)
    with driving(trainer, spec.lease), _block_artifacts(trainer, block):
        try:
            return run_block_task(spec, block)
        except TrainingPreempted as e:  # checkpointed; this process was asked to stop: no retry here
            raise Preempted(e.signum, str(e)) from e


def _block_artifacts(trainer: Any, block: Block):
    """A block publishes only its own rows (``<run>-block-<i>-metrics``), never the parent's keys."""
    hooks = getattr(trainer, "hooks", None)
    return hooks.block_scope(block.index) if isinstance(hooks, PrefectHooks) else contextlib.nullcontext()


#: how many crashes of one block's flow run the parent sits out before it gives up on the block
MAX_BLOCK_CRASHES = 3
#: seconds a block may stay Crashed (for the reschedule automation to act) before the parent
#: puts it back to Scheduled itself
CRASHED_GRACE_S = 60.0
#: seconds between two looks at a deployed block's state
BLOCK_POLL_S = 5.0


def block_idempotency_key(spec: RunSpec, block: Block) -> str:
    """The key of the one ``rl-block`` flow run per (parent flow run, lease generation, block).

    A parent flow run that runs again (rescheduled after its host died) asks for the same
    block again and gets the flow run it started before (still running, or done) instead
    of a second one training the same iterations; under a new lease generation (the
    parent took the run's lease anew, so the earlier child can no longer join it) it gets
    a new child.
    """
    generation = (spec.lease or {}).get("generation")
    return f"{flow_run.id}:{spec.settings.get('run_id')}:g{generation}:block-{block.index}"


def _dispatch_block(spec: RunSpec, block: Block, deployed: bool) -> dict[str, Any]:
    with tags("gpu"):
        if not deployed:
            return rl_iteration_block(spec, block)
    child = run_deployment(BLOCK_DEPLOYMENT, parameters={"spec": spec.model_dump(mode="json"),
                                                         "block": block.model_dump()},
                           tags=["gpu"], timeout=0, idempotency_key=block_idempotency_key(spec, block))
    child = _wait_for_block(child.id, block)
    if not child.state or not child.state.is_completed():
        why = f": {child.state.message}" if child.state and child.state.message else ""
        raise BlockFailedError(f"RL block {block.index} [{block.start}:{block.stop}) of run "
                               f"{spec.settings.get('run_id')}: flow run {child.id} ended "
                               f"{child.state.name if child.state else 'without a state'}{why}")
    # Not child.state.result(): flow results live in the worker's PREFECT_HOME, which
    # another machine cannot read; the block's checkpoint in the shared run store counts.
    return {"block": block.index, "start": block.start, "stop": block.stop, "iteration": block.stop,
            "flow_run_id": str(child.id)}


def _wait_for_block(child_id: Any, block: Block) -> Any:
    """Poll the block's flow run until it is final; Crashed counts as final only after
    :data:`MAX_BLOCK_CRASHES` crashes.

    Crashed means the block's process or host died (the zombie automation marks it so), not
    that the block cannot be trained: run again, it resumes from the previous checkpoint.
    The reschedule automation of ``deployments/automations.yaml`` puts it back to Scheduled
    within seconds; only a block still Crashed after :data:`CRASHED_GRACE_S` (no automation
    on this server) is put back by the parent, so that the two never both act.
    """
    from prefect.client.orchestration import get_client
    from prefect.states import Scheduled

    crashes: list[Any] = []  # the ids of the Crashed states seen
    crashed_since = None
    with get_client(sync_client=True) as client:
        while True:
            child = client.read_flow_run(child_id)
            state = child.state
            if state is not None and state.is_crashed():
                if state.id not in crashes:
                    crashes.append(state.id)
                    crashed_since = time.monotonic()
                    get_run_logger().warning("RL block %d: flow run %s crashed (%s; crash %d of at most %d)",
                                             block.index, child.id, state.message, len(crashes),
                                             MAX_BLOCK_CRASHES)
                if len(crashes) >= MAX_BLOCK_CRASHES:
                    return child
                if time.monotonic() - crashed_since >= CRASHED_GRACE_S:
                    client.set_flow_run_state(child.id, Scheduled(message="nipflow: block dispatched again "
                                                                          "after a crash"))
            elif state is not None and state.is_final():
                return child
            time.sleep(BLOCK_POLL_S)


def drive_blocks(trainer: Any, spec: RunSpec, block_size: int, dispatch: BlockDispatch = "auto") -> list[dict]:
    """Run every block of ``trainer``'s run in order (finished blocks come back cached)."""
    deployed = dispatch == "deployment" or (dispatch == "auto" and deployment.id is not None)
    hooks = trainer.hooks if isinstance(getattr(trainer, "hooks", None), PrefectHooks) else None
    if hooks is not None and hooks.run is None:
        hooks.attach(trainer.run)
    results = []
    for block in plan_blocks(trainer.hyper_params.rl.num_iterations, block_size):
        results.append(_dispatch_block(spec, block, deployed))
        get_run_logger().info("run %s: block %d [%d:%d) done", spec.settings.get("run_id"),
                              block.index, block.start, block.stop)
        if hooks is not None:  # the parent's one table of all iterations, from the run store
            try:
                hooks.publish_run(block.stop)
            except Exception as e:  # noqa: BLE001 - observability must never stop training
                get_run_logger().warning("could not update the Prefect artifacts of run %s: %s",
                                         spec.settings.get("run_id"), e)
    return results


def run_tensordict(trainer: Any, block_size: int) -> dict[str, Any]:
    """Train ``trainer`` block by block, then run its test loop (inside a flow run).

    Parameters
    ----------
    trainer
        A TensorDict RL trainer (``IterationTrainer``) whose run is open.
    block_size
        The number of iterations of one block. The blocks are subflows of this process,
        or runs of the ``rl-block`` deployment when this flow run is deployed.
    """
    # The device as asked ("auto"), not as this host resolved it: each block resolves it
    # on the host it runs on (TensorDict trainers keep the request in requested_device).
    settings = trainer.settings.model_copy(
        update={"device": getattr(trainer, "requested_device", trainer.settings.device)})
    spec = RunSpec.for_trainer(trainer, settings)
    remember_trainer(spec, trainer)  # local subflows and tasks reuse it instead of building another
    blocks = drive_blocks(trainer, spec, block_size)
    trainer.reload_state()  # the blocks may have trained in other processes (deployed)
    if callable(getattr(trainer, "run_test_loop", None)) or (
            callable(getattr(trainer, "test", None)) and trainer.hyper_params.rl.num_test_iterations > 0):
        run_test_loop_task(spec, trainer.hyper_params.rl.num_iterations)
    return {"run_id": trainer.run.run_id, "blocks": len(blocks),
            "iteration": blocks[-1]["iteration"] if blocks else 0, "location": trainer.run.location}

"""A fault in an RL block of a real (tiny) GI vanilla_ppo run: Prefect retries the block and
the final parameters equal those of an uninterrupted ``Trainer.train()`` run, bit for bit."""

from __future__ import annotations

import pytest
import torch

from nip_core.parameters.agents import GraphIsomorphismAgentParameters
from nip_core.trainers.checkpoint_files import read_checkpoint

TINY = GraphIsomorphismAgentParameters.construct_test_params().model_dump()
ITERATIONS, BLOCK, FAULT_AT = 4, 2, 3  # the fault hits the second block, after one of its iterations


def _parameters(tmp_path, run_id):
    from flows.parameters import ExperimentParameters

    rl = dict(frames_per_batch=16, num_iterations=ITERATIONS, num_epochs=1, minibatch_size=8,
              num_test_iterations=1, num_normalization_steps=3)
    return ExperimentParameters(
        scenario="graph_isomorphism", trainer="vanilla_ppo", protocol="nip", dataset="test", run_id=run_id,
        params={"d_representation": 2, "agents": {"_default": TINY}, "rl": rl},
        runs_dir=str(tmp_path / "runs"), block_size=BLOCK, settings_overrides={"data_dir": str(tmp_path / "data")})


def _final_agents(tmp_path, run_id):
    from nip_core.runs import RunStore

    data, manifest = RunStore(str(tmp_path / "runs")).open_run(run_id).load_checkpoint_bytes(
        f"iter_{ITERATIONS:06d}")
    assert manifest["iteration"] == ITERATIONS
    return read_checkpoint(data, source=run_id)["agents"]  # safetensors + JSON, never unpickled


@pytest.mark.slow
def test_faulty_block_is_retried_and_ends_with_the_uninterrupted_parameters(prefect_server, tmp_path, monkeypatch):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    from flows.experiment import train_experiment
    from nip_core.trainers import build_trainer
    from nip_core.trainers.tensordict_rl import TensorDictRlTrainer

    torch.set_num_threads(1)
    reference = _parameters(tmp_path, "reference")
    hp = reference.hyper_params()
    trainer = build_trainer(hp, reference.settings(hp))
    trainer.train()
    trainer.close()

    calls: list[int] = []
    inner = TensorDictRlTrainer._train_iteration

    def faulty(self, iteration):
        calls.append(iteration)
        if iteration == FAULT_AT and calls.count(FAULT_AT) == 1:
            raise RuntimeError(f"injected fault at iteration {iteration}")
        return inner(self, iteration)

    monkeypatch.setattr(TensorDictRlTrainer, "_train_iteration", faulty)
    state = train_experiment(**_parameters(tmp_path, "faulty").flow_parameters(), return_state=True)
    assert state.is_completed(), state.message
    # block 1 ([2, 4)) ran iteration 2 again after the fault: it restarted from the block-0 checkpoint
    assert calls == [0, 1, 2, 3, 2, 3]

    with get_client(sync_client=True) as client:
        blocks = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[state.state_details.flow_run_id])))
    assert sorted((b.name, b.run_count, b.state.name) for b in blocks if b.name.startswith("rl-block")) == [
        ("rl-block-0[0:2]", 1, "Completed"), ("rl-block-1[2:4]", 2, "Completed")]

    expected, got = _final_agents(tmp_path, "reference"), _final_agents(tmp_path, "faulty")
    assert expected and expected.keys() == got.keys()
    for name in expected:
        assert torch.equal(expected[name], got[name]), name

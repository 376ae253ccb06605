"""The registered graph-isomorphism builder, and a whole run through ``build_trainer``."""

from __future__ import annotations

import pytest

from nip_core.parameters import HyperParameters
from nip_core.parameters.agents import GraphIsomorphismAgentParameters
from nip_core.runs import RunStore
from nip_core.scenarios.registry import build_scenario_instance
from nip_core.settings import ExperimentSettings
from nip_core.trainers.build import build_trainer

TINY = GraphIsomorphismAgentParameters.construct_test_params().model_dump()
TINY_SOLO = {k: v for k, v in TINY.items()
             if k not in ("d_node_selector", "num_node_selector_layers", "d_value", "num_value_layers")}


def params(trainer="vanilla_ppo", protocol="nip", **kw):
    if trainer == "solo_agent":  # no RL loop, no node-selector or value heads (docs/behaviour.md#b43)
        return HyperParameters(scenario="graph_isomorphism", trainer=trainer, dataset="test",
                               interaction_protocol=protocol, d_representation=2, agents={"_default": TINY_SOLO},
                               **kw)
    rl = dict(frames_per_batch=16, num_iterations=2, num_epochs=1, minibatch_size=8, num_test_iterations=1,
              num_normalization_steps=3)
    rl.update(kw.pop("rl", {}))
    return HyperParameters(scenario="graph_isomorphism", trainer=trainer, dataset="test",
                           interaction_protocol=protocol, d_representation=2, agents={"_default": TINY},
                           rl=rl, **kw)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("data"))


@pytest.mark.parametrize("trainer,protocol,critic", [("vanilla_ppo", "nip", True), ("reinforce", "debate", False),
                                                     ("spg", "nip", True)])
def test_rl_scenario_components(data_dir, trainer, protocol, critic):
    hp = params(trainer, protocol)
    settings = ExperimentSettings(use_wandb=False, runs_dir=data_dir, data_dir=data_dir)
    instance = build_scenario_instance(hp, settings, trainer_type="rl")
    assert instance.train_dataset.max_nodes == 8 and len(instance.train_dataset) == 100
    env = instance.train_environment
    assert env.num_envs == 16 // instance.protocol_handler.max_message_rounds
    agents = instance.extras["combined_agents"]
    assert list(agents.policy_body) == instance.protocol_handler.agent_names
    assert (len(agents.value_head) > 0) == critic and instance.extras["use_critic"] == critic
    td = env.reset()
    message_logits, _ = agents.policy(td)
    assert message_logits.shape[:2] == (env.num_envs, env.num_agents)


def test_solo_scenario_has_no_environment(data_dir):
    hp = params("solo_agent")
    settings = ExperimentSettings(use_wandb=False, runs_dir=data_dir, data_dir=data_dir)
    instance = build_scenario_instance(hp, settings, trainer_type="solo_agent")
    assert instance.train_environment is None
    assert set(instance.extras["combined_agents"].solo_head) == {"prover", "verifier"}


def test_build_trainer_trains_and_resumes_through_the_run_store(tmp_path, data_dir, one_thread):
    hp = params(rl=dict(num_iterations=3), nip_protocol=dict(max_message_rounds=4))
    settings = ExperimentSettings(use_wandb=False, runs_dir=str(tmp_path), data_dir=data_dir, run_id="gi",
                                  show_progress=False)
    trainer = build_trainer(hp, settings)
    trainer.run_iterations(0, 2)  # "killed" after 2 iterations
    resumed = build_trainer(hp, settings)
    assert resumed.state.iteration == 2
    resumed.train()
    run = RunStore(str(tmp_path)).open_run("gi", hp)
    assert sorted(run.list_checkpoints()) == ["iter_000002", "iter_000003"]
    rows = run.read_metrics()
    assert sorted(r["iteration"] for r in rows if r["kind"] == "train") == [0, 1, 2]
    assert any(r["kind"] == "test" for r in rows)

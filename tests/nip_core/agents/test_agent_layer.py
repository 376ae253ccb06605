"""nip's agent layer: the GI parts subclass the bases, scenario instances hold ``Agent``s,
and a new GI architecture built from the base classes alone plugs in and trains."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from nip_core.agents import (
    Agent,
    AgentBody,
    AgentHead,
    AgentPart,
    AgentPolicyHead,
    AgentValueHead,
    PureTextWholeAgent,
    SoloAgentHead,
    TensorDictAgentPartMixin,
)
from nip_core.scenarios.graph_isomorphism.agents import (
    GRAPH_ISOMORPHISM_PART_CLASSES,
    CombinedAgents,
    ConstantValueHead,
    GraphIsomorphismAgentBody,
    GraphIsomorphismPolicyHead,
    GraphIsomorphismSoloHead,
    GraphIsomorphismValueHead,
    RandomAgentBody,
    RandomPolicyHead,
    build_combined_agents,
)
from nip_core.scenarios.graph_isomorphism.agents.stacked import can_stack
from nip_core.scenarios.graph_isomorphism.build import build_graph_isomorphism
from nip_core.scenarios.registry import ScenarioInstance
from tests.nip_core.environments.standins import RandomGraphDataset
from tests.nip_core.trainers.gi_helpers import TINY, settings_for, tiny_params, tiny_scenario


def scenario_with(hp, settings, part_classes):
    """The tiny GI scenario of the trainer tests, built with ``part_classes``."""
    return build_graph_isomorphism(hp, settings, part_classes=part_classes,
                                   train_dataset=RandomGraphDataset(n=24, max_nodes=6, min_nodes=4, seed=0),
                                   test_dataset=RandomGraphDataset(n=24, max_nodes=6, min_nodes=4, seed=1))


class MeanFeatureBody(TensorDictAgentPartMixin, AgentBody):
    """A new architecture: an MLP over each node's message-history features, summed per graph."""

    in_keys = ("x", "node_mask")
    out_keys = ("graph_level_repr", "node_level_repr")

    def __init__(self, hyper_params, settings, agent_name, protocol_handler, *, max_nodes):
        super().__init__(hyper_params, settings, agent_name, protocol_handler)
        self.max_nodes = max_nodes
        d_in = protocol_handler.max_message_rounds * len(self.visible_channel_indices) * hyper_params.message_size
        self.mlp = nn.Sequential(nn.Linear(d_in, 8), nn.Tanh(), nn.Linear(8, self.d_representation))

    def forward(self, x, node_mask):
        B = x.shape[0]
        features = x.reshape(B, -1, 2, self.max_nodes).permute(0, 2, 3, 1)  # (B, 2, N, d_in)
        nodes = self.mlp(features) * node_mask.unsqueeze(-1).to(features.dtype)
        return nodes.sum(-2), nodes


class BiasValueHead(TensorDictAgentPartMixin, AgentValueHead):
    """A new value head: a linear map of the pooled representations."""

    in_keys = ("graph_level_repr",)
    out_keys = ("value",)

    def __init__(self, hyper_params, settings, agent_name, protocol_handler, *, max_nodes):
        super().__init__(hyper_params, settings, agent_name, protocol_handler)
        self.linear = nn.Linear(2 * self.hyper_params.d_representation, 1)

    def forward(self, graph_repr):
        return self.linear(graph_repr.reshape(graph_repr.shape[0], -1))


def test_stock_parts_subclass_the_bases(tmp_path):
    hp = tiny_params(agents={"_default": TINY, "prover": {"is_random": True}})
    instance = tiny_scenario(hp, settings_for(tmp_path))
    prover, verifier = instance.agents["prover"], instance.agents["verifier"]
    solo = tiny_scenario(tiny_params(trainer="solo_agent"), settings_for(tmp_path), trainer_type="solo_agent")
    verifier.solo_head = solo.agents["verifier"].solo_head
    assert solo.agents["verifier"].policy_head is None and solo.agents["verifier"].value_head is None
    expected = [(verifier.body, GraphIsomorphismAgentBody, AgentBody),
                (verifier.policy_head, GraphIsomorphismPolicyHead, AgentPolicyHead),
                (verifier.value_head, GraphIsomorphismValueHead, AgentValueHead),
                (verifier.solo_head, GraphIsomorphismSoloHead, SoloAgentHead),
                (prover.body, RandomAgentBody, AgentBody),
                (prover.policy_head, RandomPolicyHead, AgentPolicyHead),
                (prover.value_head, ConstantValueHead, AgentValueHead)]
    for part, cls, base in expected:
        assert type(part) is cls and isinstance(part, base) and isinstance(part, AgentPart)
        assert isinstance(part, TensorDictAgentPartMixin) and part.in_keys and part.out_keys
    for head in (verifier.policy_head, verifier.value_head, verifier.solo_head):
        assert isinstance(head, AgentHead)
    assert verifier.body.agent_name == "verifier" and verifier.body.agent_index == 1
    assert verifier.body.hyper_params is hp and verifier.body.agent_params is hp.agent_params("verifier")
    assert verifier.body.is_verifier and not verifier.body.is_prover and verifier.policy_head.has_decider
    assert instance.agents["prover"].policy_head.has_decider is False
    assert verifier.body.device == torch.device("cpu")


@pytest.mark.parametrize("shared", [True, False])
def test_scenario_instance_holds_agents_whose_parts_the_combined_module_runs(tmp_path, shared):
    hp = tiny_params(rl=dict(use_shared_body=shared))
    instance = tiny_scenario(hp, settings_for(tmp_path))
    combined = instance.extras["combined_agents"]
    assert list(instance.agents) == ["prover", "verifier"]
    assert isinstance(combined, CombinedAgents) and instance.combined_policy_head is combined
    for name, agent in instance.agents.items():
        assert isinstance(agent, Agent) and agent.name == name and agent.solo_head is None
        if shared:
            assert agent.policy_body is None and agent.value_body is None
            assert combined.policy_body[name] is agent.body
        else:
            assert agent.body is None
            assert combined.policy_body[name] is agent.policy_body
            assert combined.value_body[name] is agent.value_body
            assert can_stack([agent.policy_body, agent.value_body])  # the fast path stays in use
        assert combined.policy_head[name] is agent.policy_head and combined.value_head[name] is agent.value_head
        assert {id(p) for p in agent.parameters()} <= {id(p) for p in combined.parameters()}
    assert (instance.combined_body is combined) == shared
    # checkpoint keys are those of the module's ModuleDicts, unchanged by the Agent layer
    prefixes = {key.split(".")[0] for key in combined.state_dict()}
    assert prefixes == ({"policy_body", "policy_head", "value_head"} if shared else
                        {"policy_body", "value_body", "policy_head", "value_head"})


def test_agent_consistency_checks():
    body = nn.Linear(1, 1)
    with pytest.raises(ValueError, match="either body or policy_body"):
        Agent(body=body, policy_body=body)
    with pytest.raises(ValueError, match="value_body needs a policy_body"):
        Agent(value_body=body)
    with pytest.raises(ValueError, match=r"\['policy_head'\] need a body"):
        Agent(policy_head=body)
    with pytest.raises(ValueError, match="whole agent has no other parts"):
        Agent(whole=object(), body=body)
    with pytest.raises(TypeError, match="no whole part"):
        ScenarioInstance(None, None, None, agents={"prover": Agent(body=body)}).whole_agents()


def test_text_agents_are_whole_agents():
    class Params:
        max_tokens_per_message, max_response_words, temperature, top_p = 7, 5, None, None

    calls = []

    class Completions:
        def create(self, **kwargs):
            calls.append(kwargs)
            message = type("M", (), {"content": "hello"})
            choice = type("C", (), {"message": message, "finish_reason": "stop"})
            return type("R", (), {"choices": [choice], "usage": type("U", (), {"total_tokens": 3})})

    client = type("Client", (), {"chat": type("Chat", (), {"completions": Completions()})})
    whole = PureTextWholeAgent("verifier", Params(), lambda: client, lambda: "base-model")
    agent = Agent(whole=whole)
    assert agent.parts() == {"whole": whole} and agent.name == "verifier"
    instance = ScenarioInstance(None, None, None, agents={"verifier": agent})
    assert instance.whole_agents() == {"verifier": whole}
    assert whole.generate([{"role": "user", "content": "hi"}], seed=4) == ("hello", "stop", 3)
    assert calls[0]["model"] == "base-model" and calls[0]["seed"] == 4 and calls[0]["max_tokens"] == 7


def test_part_classes_are_checked(tmp_path):
    hp = tiny_params()
    with pytest.raises(TypeError, match=r"part_classes\[AgentBody\].*must subclass AgentBody"):
        scenario_with(hp, settings_for(tmp_path), {AgentBody: BiasValueHead})
    with pytest.raises(TypeError, match="key 'Linear' is not one of"):
        scenario_with(hp, settings_for(tmp_path), {nn.Linear: MeanFeatureBody})

    class WrongKeys(MeanFeatureBody):
        in_keys = ("x", "graph_level_repr")

    with pytest.raises(ValueError, match=r"body of agent 'prover': WrongKeys.in_keys \['graph_level_repr'\]"):
        scenario_with(hp, settings_for(tmp_path), {AgentBody: WrongKeys})
    assert GRAPH_ISOMORPHISM_PART_CLASSES[AgentBody] is GraphIsomorphismAgentBody  # the registry is untouched


@pytest.mark.parametrize("shared", [True, False])
def test_new_architecture_trains_one_iteration(tmp_path, shared):
    from nip_core.runs import RunStore
    from nip_core.trainers.vanilla_ppo import VanillaPpoTrainer

    hp = tiny_params(rl=dict(num_iterations=1, use_shared_body=shared))
    settings = settings_for(tmp_path, run_id="custom")
    instance = scenario_with(hp, settings, {AgentBody: MeanFeatureBody, AgentValueHead: BiasValueHead})
    combined = instance.extras["combined_agents"]
    bodies = [part for agent in instance.agents.values()
              for part in (agent.body, agent.policy_body, agent.value_body) if part is not None]
    assert len(bodies) == (2 if shared else 4) and all(type(b) is MeanFeatureBody for b in bodies)
    assert all(type(a.value_head) is BiasValueHead and type(a.policy_head) is GraphIsomorphismPolicyHead
               for a in instance.agents.values())
    if not shared:  # a custom body never takes the stacked path
        assert not can_stack([combined.policy_body["prover"], combined.value_body["prover"]])
    calls = []
    for body in bodies:
        body.register_forward_hook(lambda module, args, out: calls.append(module))
    before = {id(p): p.detach().clone() for b in bodies for p in b.parameters()}

    trainer = VanillaPpoTrainer(hp, settings=settings, run=RunStore(str(tmp_path)).open_run("custom", hp),
                                scenario_instance=instance)
    assert trainer.agents is combined
    trainer.run_iterations(0, 1)

    assert calls and set(map(id, calls)) == set(map(id, bodies))  # every custom body ran
    for body in bodies:
        for p in body.parameters():
            assert not torch.equal(before[id(p)], p.detach()), (body.agent_name, p.shape)
    rows = [r for r in trainer.run.read_metrics() if r.get("kind") == "train"]
    assert len(rows) == 1
    losses = {k: v for k, v in rows[0].items() if "loss" in k}
    assert {"loss_objective", "loss_critic"} <= set(losses), losses
    assert all(math.isfinite(v) for v in losses.values()), losses
    # the checkpoint holds the custom bodies under the usual keys
    assert any(k.startswith("policy_body.prover.mlp.") for k in combined.state_dict())


def test_build_combined_agents_from_ready_agents(tmp_path):
    hp = tiny_params()
    instance = tiny_scenario(hp, settings_for(tmp_path))
    handler = instance.protocol_handler
    again = build_combined_agents(hp, handler, 6, agents=instance.agents)
    assert again.policy_body["verifier"] is instance.agents["verifier"].body
    with pytest.raises(ValueError, match="part_classes applies only"):
        build_combined_agents(hp, handler, 6, agents=instance.agents, part_classes={AgentBody: MeanFeatureBody})
    with pytest.raises(ValueError, match=r"no Agent for \['verifier'\]"):
        CombinedAgents(hp, handler, 6, {"prover": instance.agents["prover"]})
    no_value = {name: Agent(body=a.body, policy_head=a.policy_head) for name, a in instance.agents.items()}
    with pytest.raises(ValueError, match="agents.prover: use_critic is set but the agent has no value_head"):
        CombinedAgents(hp, handler, 6, no_value, use_critic=True)


def test_part_runs_on_a_tensordict_by_its_keys(tmp_path):
    from tensordict import TensorDict

    hp = tiny_params()
    instance = scenario_with(hp, settings_for(tmp_path), {AgentBody: MeanFeatureBody})
    body = instance.agents["verifier"].body
    td = instance.train_environment.reset()
    x = td["x"][:, :, body.visible_channel_indices]
    small = TensorDict({"x": x, "node_mask": td["node_mask"]}, batch_size=td.batch_size)
    assert body.forward_tensordict(small) is small
    graph_repr, node_repr = body(x, td["node_mask"])
    assert torch.equal(small["graph_level_repr"], graph_repr) and torch.equal(small["node_level_repr"], node_repr)
    assert small["graph_level_repr"].shape == (td.batch_size[0], 2, hp.d_representation)
    with pytest.raises(KeyError, match=r"input key\(s\) \['node_mask'\] not in the tensordict"):
        body.forward_tensordict(TensorDict({"x": x}, batch_size=td.batch_size))

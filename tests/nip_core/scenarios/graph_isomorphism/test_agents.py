"""Graph-isomorphism agents: shapes, masks, channel visibility, seeding and LR groups."""

from __future__ import annotations

import pytest
import torch

from nip_core.agents.lr_groups import LrFactorError
from nip_core.agents.operators import PolicyOperator, ValueOperator
from nip_core.parameters import HyperParameters
from nip_core.parameters.agents import GraphIsomorphismAgentParameters
from nip_core.scenarios.graph_isomorphism.agents import build_combined_agents
from nip_core.scenarios.graph_isomorphism.agents.combined import MASK_VALUE
from nip_core.scenarios.graph_isomorphism.environment import GraphIsomorphismEnvironment
from tests.nip_core.environments.standins import RandomGraphDataset, make_protocol

TINY = GraphIsomorphismAgentParameters.construct_test_params().model_dump()


def setup(protocol="nip", agents=None, lr=3.0, shared=True, seed=1, **rl):
    hp = HyperParameters(scenario="graph_isomorphism", trainer="vanilla_ppo", dataset="test",
                         interaction_protocol=protocol, seed=seed, d_representation=4,
                         agents=agents or {"_default": TINY},
                         rl=dict(frames_per_batch=16, lr=lr, use_shared_body=shared, **rl))
    handler = make_protocol(hp)
    env = GraphIsomorphismEnvironment(hp, RandomGraphDataset(n=8, max_nodes=6, min_nodes=4), handler)
    return hp, handler, env, build_combined_agents(hp, handler, env.max_nodes)


@pytest.mark.parametrize("protocol", ["nip", "debate"])
def test_policy_and_value_shapes_and_masks(protocol):
    hp, handler, env, agents = setup(protocol)
    td = env.reset()
    PolicyOperator(agents, "node_selected", [])(td)
    ValueOperator(agents, [])(td)
    B, A, C = env.num_envs, env.num_agents, env.num_channels
    logits = td["agents", "main_message_logits"]
    assert logits.shape == (B, A, C, 1, 12)
    assert td["agents", "value"].shape == (B, A, 1)
    absent = ~td["node_mask"].reshape(B, 12)
    assert (logits[absent.view(B, 1, 1, 1, 12).expand_as(logits)] == MASK_VALUE).all()
    # round 0, no message: provers may only pick graph-0 nodes, the verifier anything present
    prover = handler.agent_names.index(handler.prover_names[0])
    assert (logits[:, prover, ..., 6:] == MASK_VALUE).all()
    verifier = handler.agent_names.index("verifier")
    assert (logits[:, verifier, ..., 6:][~absent[:, None, None, 6:].expand(B, C, 1, 6)] > MASK_VALUE).all()
    # sampled actions never hit a masked slot
    chosen = logits.gather(-1, td["agents", "node_selected"].unsqueeze(-1))
    assert (chosen > MASK_VALUE).all()


def test_prover_must_answer_in_opposite_graph():
    hp, handler, env, agents = setup()
    td = env.reset()
    td["round"][:] = 1
    td["message"].zero_()
    td["message"][:, 0, 0, 1, 0] = 1.0  # the latest message is node 0 of graph 1
    td["node_mask"][:] = True
    logits, _ = agents.policy(td)
    assert (logits[:, 0, ..., 6:] == MASK_VALUE).all() and (logits[:, 0, ..., :6] > MASK_VALUE).all()
    # invariant to a positive affine normalisation of the message
    td["message"] = (td["message"] - 0.3) / 2.0
    logits2, _ = agents.policy(td)
    assert (logits2[:, 0, ..., 6:] == MASK_VALUE).all()


def test_body_sees_only_visible_channels():
    """Each body receives x restricted to its visible channels (channel index as content)."""
    hp, handler, env, agents = setup("debate")
    seen = {}
    for name in handler.agent_names:
        body = agents.policy_body[name]
        original = body.forward

        def spy(x, *args, _name=name, _orig=original):
            seen[_name] = x[0, 0, :, 0, 0, 0].tolist()
            return _orig(x, *args)

        body.forward = spy
    td = env.reset()
    td["x"] = torch.arange(env.num_channels).float().view(1, 1, -1, 1, 1, 1).expand_as(td["x"]).clone()
    agents.policy(td)
    for index, name in enumerate(handler.agent_names):
        expected = [float(c) for c in agents.visible_channels[index]]
        assert seen[name] == expected


def test_initialisation_depends_only_on_seed_and_agent_index():
    a = setup(seed=3)[3]
    b = setup(seed=3)[3]
    c = setup(seed=4)[3]
    for (n1, p1), (n2, p2) in zip(a.named_parameters(), b.named_parameters()):
        assert n1 == n2 and torch.equal(p1, p2)
    assert not torch.equal(a.policy_body["prover"].gnn.input_layer.weight,
                           c.policy_body["prover"].gnn.input_layer.weight)
    assert not torch.equal(a.policy_body["prover"].gnn.input_layer.weight,
                           a.policy_body["verifier"].gnn.input_layer.weight)


def _lrs(agents, lr):
    """lr of every parameter by name, checking each is in exactly one group."""
    groups = [g for gs in agents.parameter_groups(lr).values() for g in gs]
    by_id = {}
    for g in groups:
        for p in g["params"]:
            assert id(p) not in by_id
            by_id[id(p)] = g["lr"]
    return {name: by_id.get(id(p)) for name, p in agents.named_parameters()}


def test_lr_factor_table_shared_body():
    prover = {**TINY, "body_lr_factor": {"actor": 0.1, "critic": 0.1},
              "gnn_lr_factor": {"actor": 0.1, "critic": 0.1}}
    agents = setup(agents={"_default": TINY, "prover": prover})[3]
    lrs = _lrs(agents, 3.0)
    assert all(v is not None for v in lrs.values())  # every parameter is optimised
    for name, lr in lrs.items():
        if name.startswith("policy_body.prover.gnn."):
            assert lr == pytest.approx(0.03), name
        elif name.startswith("policy_body.prover."):
            assert lr == pytest.approx(0.3), name
        else:
            assert lr == pytest.approx(3.0), name


def test_lr_factor_table_separate_bodies_and_agent_factor():
    verifier = {**TINY, "agent_lr_factor": {"actor": 0.5, "critic": 2.0},
                "body_lr_factor": {"actor": 1.0, "critic": 10.0},
                "gnn_lr_factor": {"actor": 1.0, "critic": 10.0}}
    agents = setup(agents={"_default": TINY, "verifier": verifier}, shared=False)[3]
    lrs = _lrs(agents, 3.0)
    expected_prefixes = [
        ("value_body.verifier.gnn.", 3.0 * 2 * 10 * 10), ("value_body.verifier.", 3.0 * 2 * 10),
        ("policy_body.verifier.", 1.5), ("policy_head.verifier.", 1.5), ("value_head.verifier.", 6.0),
        ("", 3.0),
    ]
    for name, lr in lrs.items():
        want = next(v for prefix, v in expected_prefixes if name.startswith(prefix))
        assert lr == pytest.approx(want), name


def test_lr_zero_freezes_and_shared_body_needs_equal_factors():
    frozen = {**TINY, "body_lr_factor": {"actor": 0.0, "critic": 0.0}}
    agents = setup(agents={"_default": TINY, "prover": frozen})[3]
    lrs = _lrs(agents, 3.0)
    for name, p in agents.named_parameters():
        if name.startswith("policy_body.prover."):
            assert lrs[name] is None and not p.requires_grad
        else:
            assert lrs[name] is not None
    unequal = {**TINY, "body_lr_factor": {"actor": 1.0, "critic": 2.0}}
    agents = setup(agents={"_default": TINY, "prover": unequal})[3]
    with pytest.raises(LrFactorError, match="agents.prover.body_lr_factor"):
        agents.parameter_groups(3.0)


def _path_and_triangle_td(env, y: int):
    """Every env row: graph 0 a path 0-1-2, graph 1 a path 0-1-2 and a triangle 3-4-5 apart;
    the verifier's latest message is node 1 (the middle) of graph 0."""
    td = env.reset()
    td["adjacency"].zero_()
    for g, edges in ((0, [(0, 1), (1, 2)]), (1, [(0, 1), (1, 2), (3, 4), (4, 5), (3, 5)])):
        for u, v in edges:
            td["adjacency"][:, g, u, v] = td["adjacency"][:, g, v, u] = 1
    td["node_mask"][:] = False
    td["node_mask"][:, 0, :3] = True
    td["node_mask"][:, 1, :] = True
    td["round"][:] = 1
    td["message"].zero_()
    td["message"][:, 0, 0, 0, 1] = 1.0
    td["y"][:] = y
    return td


@pytest.mark.parametrize(("y", "candidates"), [(1, [7]), (0, [6, 8, 9, 10, 11])])
def test_oracle_prover_answers_with_the_verifiers_colour_iff_isomorphic(y, candidates):
    hp, handler, env, agents = setup(agents={"_default": TINY, "prover": {"kind": "oracle_prover"}})
    td = _path_and_triangle_td(env, y)
    logits, _ = agents.policy(td)
    prover = handler.agent_names.index("prover")
    allowed = (logits[:, prover, 0, 0] > MASK_VALUE).nonzero()[:, 1].reshape(env.num_envs, -1)
    # the path's middle node has one match in graph 1 (slot 6 + 1); the path's ends and the
    # triangle's nodes are of other colours
    assert (allowed == torch.tensor(candidates)).all()
    PolicyOperator(agents, "node_selected", [])(td)
    assert set(td["agents", "node_selected"][:, prover, 0, 0].tolist()) <= set(candidates)
    # with the normalised message of rl.normalize_observations it answers the same
    td["message"] = (td["message"] - 0.3) / 2.0
    assert torch.equal(agents.policy(td)[0][:, prover], logits[:, prover])


def test_oracle_prover_without_a_wanted_node_answers_anywhere_in_the_other_graph_and_is_never_trained():
    hp, handler, env, agents = setup(agents={"_default": TINY, "prover": {"kind": "oracle_prover"}})
    td = _path_and_triangle_td(env, 1)
    td["node_mask"][:, 1, :3] = False  # graph 1 is the triangle alone: no node of the middle's colour
    td["adjacency"][:, 1, :3, :3] = 0
    prover = handler.agent_names.index("prover")
    allowed = (agents.policy(td)[0][:, prover, 0, 0] > MASK_VALUE).nonzero()[:, 1].reshape(env.num_envs, -1)
    assert (allowed == torch.tensor([9, 10, 11])).all()
    groups = agents.parameter_groups(3.0)
    assert "prover" not in groups and groups["verifier"]
    assert not any(p.requires_grad for name, p in agents.named_parameters() if ".prover." in name)


@pytest.mark.parametrize(("scenario", "trainer", "name", "message"), [
    ("graph_isomorphism", "vanilla_ppo", "verifier", "'verifier' of scenario 'graph_isomorphism' cannot be one"),
    ("graph_isomorphism", "vanilla_ppo", "_default", "'_default' of scenario 'graph_isomorphism' cannot be one"),
    ("code_validation", "pure_text_ei", "prover", "'prover' of scenario 'code_validation' cannot be one"),
])
def test_an_oracle_prover_is_refused_outside_a_graph_isomorphism_prover(scenario, trainer, name, message):
    with pytest.raises(ValueError, match=f"agents.{name}: an oracle_prover is a graph-isomorphism prover; {message}"):
        HyperParameters(scenario=scenario, trainer=trainer, dataset="test" if scenario == "graph_isomorphism" else
                        "buggy_apps_small", agents={name: {"kind": "oracle_prover"}})

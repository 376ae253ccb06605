"""Stacked bodies of which some want their graph-level representation alone (a value body under
the stock value head): the graph-level result and every gradient are those of the whole body."""

from __future__ import annotations

import pytest
import torch

from nip_core.scenarios.graph_isomorphism.agents import stacked
from nip_core.scenarios.graph_isomorphism.agents.stacked import stacked_bodies_forward
from tests.nip_core.trainers.gi_helpers import TINY, make_trainer, tiny_params


def _bodies_and_inputs(tmp_path, layers: int, norm_first: bool):
    agent = dict(TINY, num_transformer_layers=layers, d_transformer=8, num_heads=2, d_transformer_mlp=8, d_gnn=8)
    trainer = make_trainer(tiny_params(agents={"_default": agent}, rl=dict(use_shared_body=False)), tmp_path)
    agents, index = trainer.agents, 1
    name = trainer.agent_names[index]
    bodies = [agents.policy_body[name], agents.value_body[name]]
    for body in bodies:
        for layer in body.transformer.layers if body.transformer is not None else []:
            layer.norm_first = norm_first
    td = trainer.train_env.reset()
    td["round"] = torch.arange(td.batch_size[0]) % 3  # messages read in later rounds
    td["message"] = torch.rand(td["message"].shape)
    ignore = td["round"] == 0
    inputs = [agents._agent_input(td, index, key, ignore) for key in bodies[0].in_keys]
    return agents, bodies, inputs, td


@pytest.mark.parametrize(("layers", "norm_first"), [(0, False), (1, False), (2, False), (2, True)])
def test_graph_only_body_gives_the_whole_bodys_graph_level_result_and_gradients(tmp_path, layers, norm_first):
    agents, bodies, inputs, _ = _bodies_and_inputs(tmp_path, layers, norm_first)

    def run(graph_only):
        agents.zero_grad(set_to_none=True)
        out = stacked_bodies_forward(bodies, *inputs, graph_only=graph_only)
        (out[0][0].sum() + 2 * out[0][1].sum() + (3 * out[1][0] ** 2).sum()).backward()
        return out, {key: p.grad.clone() for key, p in bodies[1].named_parameters() if p.grad is not None}

    whole, whole_grads = run(None)
    narrow, narrow_grads = run([False, True])
    assert whole[1][1] is not None and narrow[1][1] is None  # no node-level result asked for, none made
    assert narrow[0][1].shape == whole[0][1].shape
    torch.testing.assert_close(narrow[0][0], whole[0][0], rtol=0, atol=0)  # the other body: unchanged
    torch.testing.assert_close(narrow[0][1], whole[0][1], rtol=0, atol=0)
    torch.testing.assert_close(narrow[1][0], whole[1][0], rtol=1e-6, atol=1e-6)
    assert narrow_grads.keys() == whole_grads.keys() and len(narrow_grads) == len(list(bodies[1].parameters()))
    for key, grad in whole_grads.items():
        torch.testing.assert_close(narrow_grads[key], grad, rtol=1e-5, atol=1e-6, msg=lambda m: f"{key}: {m}")


def test_only_the_last_layer_is_narrowed_and_the_attention_asks_for_two_queries(tmp_path, monkeypatch):
    """Earlier layers' node tokens are the next layer's keys: every token goes through them."""
    agents, bodies, inputs, _ = _bodies_and_inputs(tmp_path, 2, False)
    calls = []
    real = stacked.projected_self_attention

    def spy(x, weight, bias, attn_mask, num_heads, p_dropout, queries=None):
        calls.append((x.shape[0], queries))
        return real(x, weight, bias, attn_mask, num_heads, p_dropout, queries)

    monkeypatch.setattr(stacked, "projected_self_attention", spy)
    B = inputs[0].shape[0]
    stacked_bodies_forward(bodies, *inputs, graph_only=[False, True])
    assert calls == [(2 * B, None), (B, None), (B, 2)]
    calls.clear()
    stacked_bodies_forward(bodies, *inputs)
    assert calls == [(2 * B, None), (2 * B, None)]


def test_policy_and_value_runs_the_value_bodies_for_their_graph_level_result_alone(tmp_path, monkeypatch):
    agents, _, _, td = _bodies_and_inputs(tmp_path, 1, False)
    seen = []
    real = stacked_bodies_forward

    def spy(*args, graph_only=None):
        outputs = real(*args, graph_only=graph_only)
        seen.append((list(graph_only), [node is None for _, node in outputs]))
        return outputs

    monkeypatch.setattr("nip_core.scenarios.graph_isomorphism.agents.combined.stacked_bodies_forward", spy)
    _, _, values = agents.policy_and_value(td)
    assert seen == [([False, True], [False, True])] * len(agents.agent_names)
    torch.testing.assert_close(values, agents.value(td), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("flags", [[False, False, False], [False, True, True], [True, False, False],
                                   [False, True, False]])
def test_the_groups_parts_are_the_bodies_they_name_and_pass_their_gradients(flags):
    """Groups that are runs covering every body come out of one split (or the tensor itself); others,
    by indexing. Either way each part holds its bodies, and the gradient is that of slicing them out."""
    groups = stacked._groups(flags)
    t = torch.randn(len(flags), 3, 2, requires_grad=True)
    parts = stacked._parts(t, groups)
    sliced = [stacked._take(t, index) for index, _ in groups]
    assert len(parts) == len(groups)
    for part, expected, (index, _) in zip(parts, sliced, groups):
        assert torch.equal(part, expected)
        if isinstance(index, slice):  # views of t, no copies
            assert part.data_ptr() == t[index].data_ptr()
    if flags == [False, False, False]:
        assert parts[0] is t
    weights = [torch.randn(p.shape) for p in parts]
    (got,) = torch.autograd.grad(sum((w * p).sum() for w, p in zip(weights, parts)), t)
    (want,) = torch.autograd.grad(sum((w * p).sum() for w, p in zip(weights, sliced)), t)
    assert torch.equal(got, want)


def test_can_stack_remembers_parameter_shapes_but_reads_settings_every_time(tmp_path):
    """The parameter walk is remembered per body (it ran twice a minibatch step); a setting changed on one
    body after a stacked pass still stops the stacking, and a parameter of another shape put in afterwards
    makes the stacked pass fail naming the shapes (nipflow never replaces parameters)."""
    agents, bodies, inputs, _ = _bodies_and_inputs(tmp_path, 1, False)
    assert stacked.can_stack(bodies)
    assert all(body in stacked._parameter_shapes for body in bodies)
    remembered = [stacked._parameter_shapes[body] for body in bodies]
    stacked_bodies_forward(bodies, *inputs)
    assert stacked.can_stack(bodies)
    assert all(stacked._parameter_shapes[body] is shapes for body, shapes in zip(bodies, remembered))  # not walked again

    layer = bodies[1].transformer.layers[0]
    layer.norm_first = True
    assert not stacked.can_stack(bodies)
    layer.norm_first = False
    assert stacked.can_stack(bodies)

    linear = bodies[1].representation_encoder
    linear.weight = torch.nn.Parameter(torch.zeros(linear.weight.shape[0] + 1, linear.weight.shape[1]))
    with pytest.raises(RuntimeError, match="stack expects each tensor to be equal size"):
        stacked_bodies_forward(bodies, *inputs)

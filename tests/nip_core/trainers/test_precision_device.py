"""rl.precision (fp32 / bf16 mixed precision), the GI hot path's kernels, and device-readiness."""

from __future__ import annotations

import logging

import pydantic
import pytest
import torch
from torch import nn

from nip_core.agents.mlp import FastTanh
from nip_core.environments.rollouts import collect_batch
from nip_core.scenarios.graph_isomorphism.agents.body import GraphIsomorphismGnn, encoder_layer_forward
from nip_core.scenarios.graph_isomorphism.agents.stacked import can_stack
from nip_core.logging.result_card import result_card
from nip_core.trainers import precision as precision_module
from nip_core.trainers.precision import autocast_dtype, resolve_precision
from tests.nip_core.trainers.gi_helpers import TINY, make_trainer, tiny_params

AGENT = dict(TINY, num_transformer_layers=1, d_transformer=8, num_heads=2, d_transformer_mlp=8, d_gnn=4)


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_forward_matches_torch_layer(norm_first):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 4, 64, dropout=0.0, batch_first=True, norm_first=norm_first)
    x = torch.randn(5, 24, 16)
    blocked = torch.rand(5, 24, 24) < 0.3
    blocked[..., :2] = False  # every query sees at least the two pooled tokens
    mask = torch.zeros(5, 24, 24).masked_fill(blocked, float("-inf"))
    expected = layer(x, src_mask=mask.repeat_interleave(4, dim=0))
    got = encoder_layer_forward(layer, x, mask.unsqueeze(1))
    assert got.shape == (5, 24, 16)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_dual_gnn_is_one_batch_of_the_two_passes():
    torch.manual_seed(0)
    gnn = GraphIsomorphismGnn(6, 4, 8, 3, "tanh")
    features = torch.randn(3, 2, 5, 6)
    adjacency = (torch.rand(3, 2, 5, 5) < 0.5).float()
    adjacency = ((adjacency + adjacency.transpose(-1, -2)) > 0).float() * (1 - torch.eye(5))
    mask = torch.ones(3, 2, 5)
    mask[0, 1, 4] = 0
    adjacency = adjacency * mask.unsqueeze(-1) * mask.unsqueeze(-2)
    dual = gnn(features, adjacency, mask, dual=True)
    assert dual.shape == (3, 2, 5, 8)
    torch.testing.assert_close(dual[..., :4], gnn(features, adjacency, mask), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(dual[..., 4:], gnn(torch.zeros_like(features), adjacency, mask),
                               rtol=1e-6, atol=1e-6)
    assert (dual[0, 1, 4] == 0).all()  # an absent node stays zero


def test_unknown_precision_is_refused():
    assert autocast_dtype("fp32") is None and autocast_dtype("bf16") == torch.bfloat16
    with pytest.raises(ValueError, match="rl.precision"):
        autocast_dtype("fp16")
    with pytest.raises(pydantic.ValidationError, match="precision"):
        tiny_params(rl=dict(precision="fp16"))


@pytest.mark.parametrize("native", [True, False])
def test_auto_precision_follows_the_cpu_and_the_card_says_what_it_picked(tmp_path, monkeypatch, native):
    # a bf16 iteration measured no faster than fp32 even with native bf16 (docs/performance.md):
    # auto picks fp32 on both kinds of CPU, and the reason it records says which kind this is
    monkeypatch.setattr(precision_module, "cpu_has_native_bf16", lambda: native)
    trainer = make_trainer(tiny_params(rl=dict(precision="auto")), tmp_path)
    assert trainer.precision == "fp32"
    with trainer._precision():  # the agents' forward passes run in what was picked
        assert not torch.is_autocast_enabled("cpu")
    record = trainer.run.metadata()["precision"]
    assert (record["requested"], record["used"]) == ("auto", "fp32")
    assert record["why"].startswith("auto: ")
    assert ("computes bf16 natively" in record["why"]) == ("measured no faster" in record["why"]) == native
    assert ("no native bf16" in record["why"]) != native
    assert result_card(trainer.run).precision == f"fp32 ({record['why']})"


def test_auto_precision_is_float32_off_the_cpu_and_explicit_values_stay(monkeypatch, caplog):
    assert resolve_precision("auto", "cuda")[0] == "fp32"
    monkeypatch.setattr(precision_module, "cpu_has_native_bf16", lambda: True)
    assert resolve_precision("bf16", "cpu") == ("bf16", "rl.precision")
    assert "rl.precision=bf16" not in caplog.text
    # bf16 asked for on a CPU without native bf16 is kept, with a warning that says what it costs
    monkeypatch.setattr(precision_module, "cpu_has_native_bf16", lambda: False)
    with caplog.at_level(logging.WARNING, logger=precision_module.__name__):
        used, why = resolve_precision("bf16", "cpu")
    assert used == "bf16" and why.startswith("rl.precision; this CPU has no native bf16")
    assert "rl.precision=bf16: this CPU has no native bf16" in caplog.text and "auto would pick fp32" in caplog.text
    assert resolve_precision("bf16", "cuda") == ("bf16", "rl.precision")
    assert resolve_precision("fp32", "cuda") == ("fp32", "rl.precision")
    with pytest.raises(ValueError, match="rl.precision"):
        resolve_precision("fp16", "cpu")


def test_bf16_runs_the_bodies_in_bf16_and_returns_fp32_logits_and_values(tmp_path):
    # Without batch norm, as in the paper's grid: nip's batch norm normalises by the statistics of
    # the batch (here 16 pooled graphs) and divides bf16's rounding by each feature's spread over
    # them. With it, a GNN output 0.006 off in bf16 (under two bf16 steps) became logits 0.17 off
    # through autocast's bf16 products and 0.23 off through their float32 emulation (a CPU without
    # native bf16): a property of this batch, not of bf16. Without it: 0.045 and 0.010.
    agent = dict(AGENT, use_batch_norm=False)
    trainer = make_trainer(tiny_params(agents={"_default": agent}, rl=dict(precision="bf16")), tmp_path)
    td = trainer.train_env.reset()
    body = trainer.agents.policy_body[trainer.agent_names[0]]
    seen = []
    handle = body.register_forward_hook(lambda module, args, out: seen.append(out[1].dtype))
    with torch.no_grad():
        with trainer._precision():
            logits, decisions = trainer.agents.policy(td)
            values = trainer.agents.value(td)
        fp32_logits, _ = trainer.agents.policy(td)
    handle.remove()
    assert seen[0] == torch.bfloat16 and seen[-1] == torch.float32
    assert logits.dtype == decisions.dtype == values.dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in trainer.agents.parameters())  # fp32 master weights
    present = fp32_logits > -1e8
    assert (logits[present] - fp32_logits[present]).abs().max() < 0.2  # bf16 rounding, not garbage
    assert not torch.equal(logits, fp32_logits)


@pytest.mark.parametrize("loss_type", ["clip", "kl_penalty"])
def test_hot_path_tensors_follow_the_device(tmp_path, loss_type):
    """On the meta device a tensor made on the CPU in the hot path (no ``device=``) or a
    tensor attribute that is not a registered buffer breaks the forward pass."""
    hp = tiny_params(agents={"_default": AGENT}, ppo=dict(loss_type=loss_type), rl=dict(use_shared_body=False))
    trainer = make_trainer(hp, tmp_path)
    with torch.no_grad():
        batch, _ = collect_batch(trainer.train_env, trainer.policy_operator, trainer._carried_td, 4)
        trainer._add_values_and_advantages(batch)
    minibatch = batch.reshape(-1)[:8].to("meta")
    trainer.loss_module.to("meta")
    tensors = list(trainer.loss_module.parameters()) + list(trainer.loss_module.buffers())
    assert len(list(trainer.agents.buffers())) >= 2  # masks and prover flags are buffers
    assert all(t.device.type == "meta" for t in tensors)
    losses = trainer.loss_module(minibatch)
    assert losses["loss_objective"].device.type == "meta"
    assert losses["agents", "loss_critic"].shape == (len(trainer.agent_names),)
    for part in ("policy_body", "value_body"):
        for body in getattr(trainer.agents, part).values():
            assert body.same_graph_mask.device.type == "meta"


def test_compile_mode_compiles_the_loss_forward_once(tmp_path, monkeypatch):
    trainer = make_trainer(tiny_params(), tmp_path)
    calls = []

    def fake_compile(module, mode=None):
        calls.append(mode)
        return lambda td: {"compiled": module(td)}

    monkeypatch.setattr(torch, "compile", fake_compile)
    with torch.no_grad():
        batch, _ = collect_batch(trainer.train_env, trainer.policy_operator, trainer._carried_td, 2)
        trainer._add_values_and_advantages(batch)
    minibatch = batch.reshape(-1)[:4]
    assert "compiled" not in trainer._loss_forward(minibatch)  # eager by default
    trainer.compile_mode = "reduce-overhead"
    assert "compiled" in trainer._loss_forward(minibatch)
    assert "compiled" in trainer._loss_forward(minibatch)
    assert calls == ["reduce-overhead"]


def test_fast_tanh_matches_tanh_and_is_twice_differentiable():
    torch.manual_seed(0)
    x = torch.randn(4000, requires_grad=True)
    y = FastTanh()(x)
    (grad,) = torch.autograd.grad(y.sum(), x, create_graph=True)
    (second,) = torch.autograd.grad(grad.sum(), x)
    reference = x.detach().tanh()
    torch.testing.assert_close(y, reference, rtol=0, atol=3e-7)
    torch.testing.assert_close(grad, 1 - reference ** 2, rtol=0, atol=1e-6)
    torch.testing.assert_close(second, -2 * reference * (1 - reference ** 2), rtol=0, atol=2e-6)
    small = torch.randn(3, 5, dtype=torch.double, requires_grad=True)
    assert torch.autograd.gradgradcheck(FastTanh(), (small,))


@pytest.mark.parametrize("norm_first", [False, True])
def test_stacked_policy_and_value_bodies_match_separate_bodies(tmp_path, norm_first):
    hp = tiny_params(agents={"_default": AGENT}, rl=dict(use_shared_body=False))
    trainer = make_trainer(hp, tmp_path)
    agents = trainer.agents
    for part in (agents.policy_body, agents.value_body):
        for body in part.values():
            for layer in body.transformer.layers:
                layer.norm_first = norm_first
    names = trainer.agent_names
    assert all(can_stack([agents.policy_body[n], agents.value_body[n]]) for n in names)
    assert not can_stack([agents.policy_body[names[0]]])  # nothing to stack
    td = trainer.train_env.reset()
    calls = []
    handles = [body.register_forward_hook(lambda module, args, out: calls.append(module))
               for part in (agents.policy_body, agents.value_body) for body in part.values()]

    def outputs_and_grads(fn):
        agents.zero_grad(set_to_none=True)
        logits, decisions, values = fn()
        present = logits > -1e8
        (logits[present].sum() + decisions.sum() + 3 * values.sum()).backward()
        return (logits, decisions, values), {k: p.grad.clone() for k, p in agents.named_parameters()
                                             if p.grad is not None}

    separate, separate_grads = outputs_and_grads(lambda: (*agents.policy(td), agents.value(td)))
    assert len(calls) == 2 * len(names)
    calls.clear()
    stacked, stacked_grads = outputs_and_grads(lambda: agents.policy_and_value(td))
    assert calls == []  # the bodies ran stacked, not one by one
    for handle in handles:
        handle.remove()
    for a, b in zip(separate, stacked):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    assert stacked_grads.keys() == separate_grads.keys()
    assert any(k.startswith("value_body.") for k in stacked_grads)
    for key, grad in separate_grads.items():
        torch.testing.assert_close(stacked_grads[key], grad, rtol=1e-4, atol=1e-6, msg=lambda m: f"{key}: {m}")

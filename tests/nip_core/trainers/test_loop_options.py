"""Training-loop options: optimiser choice, gradient accumulation, greedy tests, timers, profiler."""

from __future__ import annotations

import json

import pytest
import torch
from pydantic import ValidationError

from nip_core.trainers import optim
from tests.nip_core.trainers.gi_helpers import make_trainer, params_of, tiny_params


@pytest.mark.parametrize("name,cls,args", [
    ("adam", optim.FusedAdam, {"betas": (0.8, 0.99)}),  # torch's Adam(W), one kernel call per settings
    ("adamw", optim.FusedAdamW, {"weight_decay": 0.01}),
    ("sgd", torch.optim.SGD, {"momentum": 0.9}),
    ("rmsprop", torch.optim.RMSprop, {"momentum": 0.5}),
    ("adagrad", torch.optim.Adagrad, {}),
])
def test_the_chosen_optimizer_trains_with_its_arguments(tmp_path, name, cls, args):
    hp = tiny_params(rl=dict(optimizer=name, **args))
    trainer = make_trainer(hp, tmp_path)
    assert type(trainer.optimizer) is cls
    assert isinstance(trainer.optimizer, {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}.get(name, cls))
    for key, value in args.items():
        assert trainer.optimizer.param_groups[0][key] == value
    before = params_of(trainer)
    trainer.run_iterations(0, 1)
    assert any(not torch.equal(before[k], v) for k, v in params_of(trainer).items())


@pytest.mark.parametrize("rl", [dict(optimizer="adam", momentum=0.9), dict(optimizer="sgd", betas=(0.5, 0.9)),
                                dict(optimizer="sgd", optimizer_eps=1e-3)])
def test_arguments_an_optimizer_does_not_take_are_refused(rl):
    with pytest.raises(ValidationError, match="momentum|betas|optimizer_eps"):
        tiny_params(rl=rl)


def test_gradient_accumulation_averages_minibatch_gradients_into_one_step(tmp_path, monkeypatch):
    hp = tiny_params(rl=dict(gradient_accumulation_steps=2, optimizer="sgd"))
    trainer = make_trainer(hp, tmp_path / "acc")
    steps: list[int] = []
    inner = trainer.optimizer.step
    monkeypatch.setattr(trainer.optimizer, "step", lambda *a, **k: (steps.append(1), inner(*a, **k))[1])
    trainer.run_iterations(0, 1)
    minibatches = hp.rl.num_epochs * (hp.rl.frames_per_batch // hp.rl.minibatch_size)
    assert len(steps) == -(-minibatches // 2)  # one step per two minibatches (the last may be alone)

    # two accumulated minibatches give the mean of their gradients
    accumulating = make_trainer(tiny_params(rl=dict(gradient_accumulation_steps=2, optimizer="sgd")), tmp_path / "g")
    params = [p for g in accumulating.optimizer.param_groups for p in g["params"]]
    grads_a = [torch.full_like(p, 1.0) for p in params]
    grads_b = [torch.full_like(p, 3.0) for p in params]
    for p, a, b in zip(params, grads_a, grads_b):
        p.grad = a + b  # what two backward passes accumulate
    seen = {}
    monkeypatch.setattr(optim, "clip_grad_norm", lambda ps, n: seen.setdefault("g", [p.grad.clone() for p in ps]))
    monkeypatch.setattr(accumulating.optimizer, "step", lambda *a, **k: None)
    accumulating._optimizer_step(params, [], 2)
    assert all(torch.equal(g, torch.full_like(g, 2.0)) for g in seen["g"])


def test_greedy_test_loop_takes_the_most_likely_actions(tmp_path, monkeypatch):
    hp = tiny_params(rl=dict(test_greedy=True, num_test_iterations=1))
    trainer = make_trainer(hp, tmp_path)
    sampled = []
    import nip_core.agents.operators as ops

    monkeypatch.setattr(ops, "sample_actions", lambda *a, **k: sampled.append(1) or (_ for _ in ()).throw(
        AssertionError("sampled in a greedy test loop")))
    trainer.test()
    assert not sampled
    sampling = make_trainer(tiny_params(rl=dict(num_test_iterations=1)), tmp_path / "s")
    with pytest.raises(AssertionError, match="sampled"):
        sampling.test()


def test_phase_timers_are_logged_and_the_profiler_writes_a_trace(tmp_path):
    hp = tiny_params()
    trainer = make_trainer(hp, tmp_path, profile_iterations="1:2")
    trainer.run_iterations(0, 3)
    rows = [r for r in trainer.run.read_metrics() if r["kind"] == "train"]
    assert len(rows) == 3
    for row in rows:
        assert all(row[f"time_{p}_s"] > 0 for p in ("collect", "gae", "update"))
    trace = json.loads(trainer.run.storage.read_bytes("profiles/iter_1-2.json"))
    assert any("aten::" in str(event.get("name", "")) for event in trace["traceEvents"])
    assert trainer.run.storage.listdir("profiles") == ["iter_1-2.json"]


def test_a_bad_profile_range_names_the_setting(tmp_path):
    from nip_core.trainers.timing import parse_iteration_range

    with pytest.raises(ValueError, match="settings.profile_iterations"):
        parse_iteration_range("5:2")
    assert parse_iteration_range("0:3") == (0, 3) and parse_iteration_range(None) is None


def test_a_smoke_run_takes_one_minibatch_step_per_iteration_and_writes_nothing(tmp_path, monkeypatch):
    """``settings.test_run`` (nip's smoke run, docs/behaviour.md#b46): the whole loop, one
    minibatch step per iteration instead of ``num_epochs x batches``, no run store."""
    from nip_core.runs import NullRun
    from nip_core.trainers.objectives.base import NipLossModule
    from nip_core.trainers.vanilla_ppo import VanillaPpoTrainer
    from tests.nip_core.trainers.gi_helpers import settings_for, tiny_scenario

    steps = []
    advantage = NipLossModule.advantage
    monkeypatch.setattr(NipLossModule, "advantage", lambda self, td: steps.append(1) or advantage(self, td))
    hp = tiny_params()
    make_trainer(hp, tmp_path / "full").run_iterations(0, 2)
    assert len(steps) == 2 * hp.rl.num_epochs * (hp.rl.frames_per_batch // hp.rl.minibatch_size) == 8
    steps.clear()
    settings = settings_for(tmp_path / "smoke", run_id="smoke", test_run=True)
    smoke = VanillaPpoTrainer(hp, settings=settings, scenario_instance=tiny_scenario(hp, settings))
    assert isinstance(smoke.run, NullRun)
    before = params_of(smoke)
    smoke.run_iterations(0, 2)
    assert len(steps) == 2
    assert any(not torch.equal(before[k], v) for k, v in params_of(smoke).items())  # it did train
    assert not (tmp_path / "smoke").exists() or not any((tmp_path / "smoke").rglob("*.json"))

"""spg: every variant trains; the Stackelberg/opponent-shaping terms change the leader's gradient."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from nip_core.runs import RunStore
from nip_core.trainers.objectives.spg import compute_sos_update
from nip_core.trainers.spg import SpgTrainer
from tests.nip_core.trainers.gi_helpers import settings_for, tiny_params, tiny_scenario

VARIANTS = ["spg", "pspg", "lola", "pola", "sos", "psos"]


def make(tmp_path, variant, run_id=None, **rl):
    hp = tiny_params("spg", spg=dict(variant=variant, ihvp_rank=3), rl={"num_iterations": 2, **rl})
    settings = settings_for(tmp_path, run_id=run_id)
    run = RunStore(str(tmp_path)).open_run(run_id, hp) if run_id else None
    return SpgTrainer(hp, settings=settings, run=run, scenario_instance=tiny_scenario(hp, settings))


def leader_grads(trainer, shaped: bool):
    """Gradients of the verifier's actor parameters on one fixed minibatch."""
    torch.manual_seed(0)
    with torch.no_grad():
        from nip_core.environments.rollouts import collect_batch
        batch, _ = collect_batch(trainer.train_env, trainer.policy_operator, trainer._carried_td.clone(),
                                 trainer.steps_per_env)
        trainer._add_values_and_advantages(batch)
    trainer.optimizer.zero_grad(set_to_none=True)
    with sdpa_kernel(SDPBackend.MATH):  # the kernel with double backward
        losses = trainer.loss_module(batch.reshape(-1))
        if shaped:
            trainer.loss_module.backward(losses)
        else:
            objective = losses["loss_matrix"][:, trainer.agent_names.index("verifier")].sum()
            (objective + losses["loss_entropy"] + losses["loss_critic"]).backward()
    return [p.grad.clone() for p in trainer.agents.actor_parameters("verifier")]


@pytest.mark.parametrize("variant", VARIANTS)
def test_variant_trains(tmp_path, variant):
    trainer = make(tmp_path, variant)
    before = {k: v.clone() for k, v in trainer.agents.state_dict().items()}
    trainer.run_iterations(0, 2)
    after = trainer.agents.state_dict()
    for name in ("prover", "verifier"):
        assert any(not torch.equal(before[k], after[k]) for k in before if f"body.{name}." in k)
        assert all(torch.isfinite(after[k]).all() for k in after if after[k].is_floating_point())


@pytest.mark.parametrize("variant", ["spg", "lola"])
def test_shaping_changes_the_leader_gradient(tmp_path, variant):
    trainer = make(tmp_path, variant)
    plain = leader_grads(trainer, shaped=False)
    shaped = leader_grads(trainer, shaped=True)
    assert any(not torch.allclose(a, b) for a, b in zip(plain, shaped))


def test_spg_resume_is_bit_identical(tmp_path):
    straight = make(tmp_path / "a", "spg", run_id="r", num_iterations=4)
    straight.run_iterations(0, 4)
    make(tmp_path / "b", "spg", run_id="r", num_iterations=4).run_iterations(0, 2)
    resumed = make(tmp_path / "b", "spg", run_id="r", num_iterations=4)
    resumed.run_iterations(2, 4)
    a, b = straight.agents.state_dict(), resumed.agents.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_sos_update_rules():
    xi = [torch.tensor([1.0, 0.0])]
    zero = [torch.zeros(2)]
    chi = [torch.tensor([-1.0, 0.0])]  # -chi.xi0 >= 0 -> p1 = 1; |xi|^2 = 1 >= b^2 -> p2 = 1
    assert torch.allclose(compute_sos_update(xi, zero, chi, 0.5, 0.1)[0], torch.tensor([2.0, 0.0]))
    chi = [torch.tensor([4.0, 0.0])]  # chi.xi0 = 4 > 0 -> p1 = min(1, 0.5 * 1 / 4) = 0.125
    assert torch.allclose(compute_sos_update(xi, zero, chi, 0.5, 0.1)[0], torch.tensor([0.5, 0.0]))
    small = [torch.tensor([0.05, 0.0])]  # |xi|^2 = 0.0025 < 0.01 -> p2 = 0.0025
    assert torch.allclose(compute_sos_update(small, zero, [torch.tensor([-1.0, 0.0])], 0.5, 0.1)[0],
                          torch.tensor([0.05 + 0.0025, 0.0]))


@pytest.mark.parametrize("variant", ["sos", "psos"])
def test_the_trainer_hands_its_sos_factors_to_the_update(tmp_path, monkeypatch, variant):
    """spg.sos_scaling_factor and spg.sos_threshold_factor reach the SOS rule (whose effect
    test_sos_update_rules shows); the tiny probes' gradients never reach its thresholds."""
    import nip_core.trainers.objectives.spg as objectives

    seen = []
    real = objectives.compute_sos_update
    monkeypatch.setattr(objectives, "compute_sos_update",
                        lambda xi, hgp, chi, a, b: seen.append((a, b)) or real(xi, hgp, chi, a, b))
    hp = tiny_params("spg", spg=dict(variant=variant, ihvp_rank=3, sos_scaling_factor=0.25, sos_threshold_factor=3.0),
                     rl={"num_iterations": 1})
    settings = settings_for(tmp_path)
    SpgTrainer(hp, settings=settings, scenario_instance=tiny_scenario(hp, settings)).run_iterations(0, 1)
    assert seen and set(seen) == {(0.25, 3.0)}

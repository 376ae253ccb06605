"""solo_agent: bodies are optimised (docs/behaviour.md#b29), split and stats."""

from __future__ import annotations

import pytest
import torch

from nip_core.trainers.solo_agent import SoloAgentTrainer
from tests.nip_core.trainers.gi_helpers import settings_for, tiny_params, tiny_scenario


def test_solo_trainer_updates_bodies_and_heads(tmp_path):
    hp = tiny_params("solo_agent", solo_agent=dict(num_epochs=2, batch_size=8))
    settings = settings_for(tmp_path)
    trainer = SoloAgentTrainer(hp, settings=settings, scenario_instance=tiny_scenario(hp, settings, "solo_agent"))
    optimised = {id(p) for opt in trainer.optimizers.values() for g in opt.param_groups for p in g["params"]}
    assert optimised == {id(p) for p in trainer.agents.parameters()}  # bodies included
    before = {k: v.clone() for k, v in trainer.agents.state_dict().items()}
    trainer.train()
    after = trainer.agents.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before if k.startswith("policy_body.verifier.gnn"))
    assert any(not torch.equal(before[k], after[k]) for k in before if k.startswith("solo_head.prover"))
    assert trainer.train_indices.numel() + trainer.test_indices.numel() == 24
    assert set(trainer.train_indices.tolist()).isdisjoint(trainer.test_indices.tolist())
    stats = trainer.test()
    assert set(stats) == {"prover.test_loss", "prover.test_accuracy", "verifier.test_loss",
                          "verifier.test_accuracy"}


def solo_trainer(tmp_path, run_id, epochs=4, **settings_kw):
    from nip_core.runs import RunStore

    hp = tiny_params("solo_agent", solo_agent=dict(num_epochs=epochs, batch_size=8))
    settings = settings_for(tmp_path, run_id=run_id, **settings_kw)
    run = RunStore(str(tmp_path)).open_run(run_id, hp)
    return SoloAgentTrainer(hp, settings=settings, run=run, scenario_instance=tiny_scenario(hp, settings, "solo_agent"))


def weights(trainer):
    return {k: v.detach().clone() for k, v in trainer.agents.state_dict().items()}


class Stop(Exception):
    pass


def test_solo_resume_is_bit_identical_and_a_finished_run_reports_its_stored_model(tmp_path, monkeypatch):
    straight = solo_trainer(tmp_path / "a", "solo", checkpoint_every=1)
    straight.train()
    final, test_stats = weights(straight), straight.test()

    crashing = solo_trainer(tmp_path / "b", "solo", checkpoint_every=1)
    original = SoloAgentTrainer.save_checkpoint

    def save_then_die(self, epoch):
        original(self, epoch)
        if epoch == 2:
            raise Stop("the process dies after epoch 2's checkpoint")

    monkeypatch.setattr(SoloAgentTrainer, "save_checkpoint", save_then_die)
    with pytest.raises(Stop):
        crashing.train()
    monkeypatch.setattr(SoloAgentTrainer, "save_checkpoint", original)
    assert crashing.run.list_checkpoints() == ["iter_000001", "iter_000002"]
    resumed = solo_trainer(tmp_path / "b", "solo", checkpoint_every=1)
    epochs_run = []
    monkeypatch.setattr(resumed, "log_stats", lambda stats, it, kind="train": epochs_run.append((kind, it)))
    resumed.train()
    assert [it for kind, it in epochs_run if kind == "train"] == [2, 3]  # only the missing epochs
    assert all(torch.equal(final[k], v) for k, v in weights(resumed).items())

    again = solo_trainer(tmp_path / "a", "solo", checkpoint_every=1)  # the finished run, run again
    untrained = weights(again)
    again.train()
    assert any(not torch.equal(untrained[k], final[k]) for k in final)
    assert all(torch.equal(final[k], v) for k, v in weights(again).items())
    assert again.test() == test_stats
    tests = [r for r in again.run.read_metrics() if r["kind"] == "test"]
    assert len(tests) == 1


def test_solo_warm_start_loads_the_source_runs_final_agents(tmp_path, monkeypatch):
    from nip_core.trainers.warm_start import prepare_warm_start

    source = solo_trainer(tmp_path, "source", epochs=2)
    source.train()
    target = solo_trainer(tmp_path, "target", epochs=1)
    prepare_warm_start(target.run, source.run)
    seen = {}
    monkeypatch.setattr(target, "_train_epochs", lambda: seen.setdefault("w", weights(target)))
    target.train()
    assert all(torch.equal(seen["w"][k], v) for k, v in weights(source).items())

"""solo_agent: bodies are optimised (QUIRK 9 fixed), split and stats."""

from __future__ import annotations

import torch

from nip_core.trainers.solo_agent import SoloAgentTrainer
from tests.nip_core.trainers.gi_helpers import settings_for, tiny_params, tiny_scenario


def test_solo_trainer_updates_bodies_and_heads(tmp_path):
    hp = tiny_params("solo_agent", solo_agent=dict(num_epochs=2, batch_size=8))
    settings = settings_for(tmp_path)
    trainer = SoloAgentTrainer(hp, settings, scenario_instance=tiny_scenario(hp, settings, "solo_agent"))
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

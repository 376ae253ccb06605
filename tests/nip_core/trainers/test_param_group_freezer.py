"""nip's ``ParamGroupFreezer`` interface over the optimiser's per-agent parameter groups."""

from __future__ import annotations

import pytest
import torch

from nip_core.trainers.optim import ParamGroupFreezer
from tests.nip_core.trainers.gi_helpers import make_trainer, tiny_params


def test_freeze_and_unfreeze_name_the_parameters_that_get_no_update():
    a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(3))
    groups = {"prover": [{"params": [a], "lr": 0.1}], "verifier": [{"params": [b], "lr": 0.2}]}
    optimizer = torch.optim.Adam([g for gs in groups.values() for g in gs])
    freezer = ParamGroupFreezer(optimizer, groups)
    assert freezer.frozen_params() == []
    freezer.freeze("verifier")
    assert freezer.frozen_params() == [b]
    freezer.freeze("prover")
    freezer.unfreeze("verifier")
    assert freezer.frozen_params() == [a] and len(optimizer.param_groups) == 2  # the groups stay
    with pytest.raises(KeyError, match="judge"):
        freezer.freeze("judge")
    with pytest.raises(ValueError, match="parameter group 0 of 'other' is not one of the optimiser's"):
        ParamGroupFreezer(optimizer, {"other": [{"params": [a], "lr": 0.1}]})


def test_the_trainers_freezer_holds_each_agents_groups(tmp_path):
    trainer = make_trainer(tiny_params(), tmp_path)
    freezer = trainer.param_group_freezer
    assert isinstance(freezer, ParamGroupFreezer) and set(freezer.param_group_collections) == {"prover", "verifier"}
    assert freezer.optimizer is trainer.optimizer
    trainer.close()

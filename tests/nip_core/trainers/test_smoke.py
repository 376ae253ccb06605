"""Smoke runs over protocols and options (the reference's test_run grid, GI part, tiny)."""

from __future__ import annotations

import math

import pytest
import torch

from nip_core.trainers.registry import get_trainer_class
from tests.nip_core.trainers.gi_helpers import TINY, settings_for, tiny_params, tiny_scenario

CASES = {
    "random_provers": ("vanilla_ppo", dict(agents={"_default": {"is_random": True}, "verifier": TINY})),
    "zero_knowledge": ("vanilla_ppo", dict(protocol_common=dict(zero_knowledge=True))),
    "debate_separate_bodies": ("vanilla_ppo", dict(interaction_protocol="debate", rl=dict(use_shared_body=False))),
    "mnip": ("vanilla_ppo", dict(interaction_protocol="mnip", mnip_protocol=dict(max_message_rounds=4))),
    "merlin_arthur": ("vanilla_ppo", dict(interaction_protocol="merlin_arthur")),
    "adp_kl": ("vanilla_ppo", dict(interaction_protocol="adp", ppo=dict(loss_type="kl_penalty"))),
    "message_size_3_anneal": ("vanilla_ppo", dict(message_size=3, rl=dict(anneal_lr=True, clip_value=True))),
    "spg_pspg_debate": ("spg", dict(interaction_protocol="debate", debate_protocol=dict(max_message_rounds=4),
                                    spg=dict(variant="pspg"))),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_smoke(tmp_path, case):
    trainer_name, overrides = CASES[case]
    hp = tiny_params(trainer_name, **overrides)
    settings = settings_for(tmp_path)
    trainer = get_trainer_class(trainer_name)(hp, settings=settings, scenario_instance=tiny_scenario(hp, settings))
    before = {k: v.clone() for k, v in trainer.agents.state_dict().items()}
    trainer.run_iterations(0, 2)
    stats = trainer.test()
    after = trainer.agents.state_dict()
    verifier_keys = [k for k in before if ".verifier." in k]
    assert any(not torch.equal(before[k], after[k]) for k in verifier_keys)
    assert all(math.isfinite(v) for v in stats.values())
    if case == "random_provers":  # random agents are never trained
        assert all(torch.equal(before[k], after[k]) for k in before if ".prover" in k)

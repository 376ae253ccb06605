"""reinforce: reward-to-go maths, both variants train and resume."""

from __future__ import annotations

import pytest
import torch

from nip_core.runs import RunStore
from nip_core.trainers.objectives.reinforce import reward_to_go
from nip_core.trainers.reinforce import ReinforceTrainer
from tests.nip_core.trainers.gi_helpers import settings_for, tiny_params, tiny_scenario


def test_reward_to_go_respects_episode_boundaries():
    reward = torch.tensor([[1.0, 2.0, 4.0, 8.0]]).unsqueeze(-1)
    done = torch.tensor([[False, True, False, False]]).unsqueeze(-1)
    out = reward_to_go(reward, done, 0.5)
    assert out.squeeze(-1).tolist() == [[1 + 0.5 * 2, 2.0, 4 + 0.5 * 8, 8.0]]


@pytest.mark.parametrize("critic", [False, True])
def test_reinforce_trains_and_resumes(tmp_path, critic):
    hp = tiny_params("reinforce", reinforce=dict(use_advantage_and_critic=critic), rl=dict(num_iterations=4))

    def make(path):
        settings = settings_for(path, run_id="r")
        run = RunStore(str(path)).open_run("r", hp)
        return ReinforceTrainer(hp, settings=settings, run=run, scenario_instance=tiny_scenario(hp, settings))

    straight = make(tmp_path / "a")
    assert (straight.value_operator is not None) == critic
    before = {k: v.clone() for k, v in straight.agents.state_dict().items()}
    straight.run_iterations(0, 4)
    make(tmp_path / "b").run_iterations(0, 2)
    resumed = make(tmp_path / "b")
    resumed.run_iterations(2, 4)
    a, b = straight.agents.state_dict(), resumed.agents.state_dict()
    assert any(not torch.equal(before[k], a[k]) for k in a)
    assert all(torch.equal(a[k], b[k]) for k in a)
    if critic:
        assert any(not torch.equal(before[k], a[k]) for k in a if k.startswith("value_head"))

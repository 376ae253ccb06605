"""The TensorDict trainers' statistics on a fixed batch, against values computed by hand.

Two environments, four steps each, agents (prover, verifier):

* row 0: an episode decided at step 1 (accept, label 1: right), then one still running;
* row 1: an episode begun in the previous batch that times out at step 1 (the verifier's
  ignored sample there is 0, label 0), then one decided at step 3 (reject, label 1: wrong).

nip's statistics leave out the running episode; its accuracy scores the time-out by the
ignored sample (right), nipflow's ``mean_decided_accuracy`` counts it wrong.
"""

from __future__ import annotations

import math

import pytest
import torch
from tensordict import TensorDict

from nip_core.environments.episode_stats import episode_stats


def fixed_batch() -> TensorDict:
    reward = torch.tensor([[[0.0, 0.1], [1.0, 1.0], [0.0, 0.2], [0.5, 0.3]],
                           [[0.0, 0.05], [-1.0, -0.5], [0.0, 0.1], [0.0, -1.0]]])  # (B, T, A)
    done = torch.tensor([[False, True, False, False], [False, True, False, True]])
    terminated = torch.tensor([[False, False, False, False], [False, True, False, False]])
    decision = torch.full((2, 4, 2), 2)
    decision[0, 1, 1], decision[1, 1, 1], decision[1, 3, 1] = 1, 0, 0
    return TensorDict({
        "round": torch.tensor([[0, 1, 0, 1], [2, 3, 0, 1]]),
        "y": torch.tensor([[1, 1, 0, 0], [0, 0, 1, 1]]),
        "datapoint_id": torch.tensor([[7, 7, 5, 5], [3, 3, 7, 7]]),
        "agents": {"decision": decision},
        "next": {"done": done[..., None], "terminated": terminated[..., None],
                 "agents": {"reward": reward[..., None]}},
    }, batch_size=[2, 4])


def test_statistics_of_a_fixed_batch_are_nips_where_nip_names_them():
    stats = episode_stats(fixed_batch(), ["prover", "verifier"], verifier_index=1)
    expected = {
        # all eight steps
        "prover.mean_step_reward": 0.5 / 8, "verifier.mean_step_reward": 0.25 / 8,
        # finished episodes: (1.0, 1.1), (-1.0, -0.45), (0.0, -0.9); the running one is left out
        "prover.mean_episode_reward": 0.0, "verifier.mean_episode_reward": -0.25 / 3,
        # datapoint 3: (-1.0, -0.45); datapoint 7: mean of (1.0, 1.1) and (0.0, -0.9) = (0.5, 0.1)
        "prover.worst_episode_reward": -1.0, "verifier.worst_episode_reward": -0.45,
        # right, right (the time-out's ignored sample), wrong
        "mean_accuracy": 2 / 3, "std_accuracy": math.sqrt(1 / 3),
        # datapoint 3: 1.0, datapoint 7: 0.5
        "mean_datapoint_accuracy": 0.75, "std_datapoint_accuracy": math.sqrt(0.125),
        "worst_datapoint_accuracy": 0.5,
        # nipflow's: only the first episode ended with a right decision; two of three decided
        "mean_decided_accuracy": 1 / 3, "decision_rate": 2 / 3,
        # last rounds 1, 3, 1
        "mean_episode_length": 8 / 3, "num_episodes": 3.0,
    }
    assert stats.keys() == expected.keys()
    for key, value in expected.items():
        assert stats[key] == pytest.approx(value, abs=1e-6), key


def test_the_test_prefix_and_a_batch_where_no_episode_finished():
    batch = fixed_batch()
    assert set(episode_stats(batch, ["prover", "verifier"], 1, prefix="test_")) == {
        f"test_{k}" if "." not in k else k.replace(".", ".test_")
        for k in episode_stats(batch, ["prover", "verifier"], 1)}
    batch["next", "done"].zero_()
    stats = episode_stats(batch, ["prover", "verifier"], 1)
    assert stats == {"prover.mean_step_reward": pytest.approx(0.5 / 8),
                     "verifier.mean_step_reward": pytest.approx(0.25 / 8), "num_episodes": 0.0}


def test_losses_are_logged_as_nip_logs_them():
    from nip_core.environments.episode_stats import loss_stats

    losses = TensorDict({"loss_objective": torch.tensor(0.5), "loss_critic": torch.tensor(3.0),
                         "loss_matrix": torch.tensor([[1.0, 2.0], [3.0, 4.0]]),
                         "agents": TensorDict({"loss_objective": torch.tensor([0.2, 0.3]),
                                               "loss_critic": torch.tensor([1.0, 2.0])}, batch_size=[2])},
                        batch_size=[])
    assert loss_stats(losses, ["prover", "verifier"], "test_", critic_coef=0.5) == {
        "test_loss_objective": 0.5, "test_loss_critic": 3.0, "test_loss_matrix": 10.0,
        "test_prover.loss_objective": pytest.approx(0.2), "test_verifier.loss_objective": pytest.approx(0.3),
        "test_prover.loss_critic": 1.0, "test_verifier.loss_critic": 2.0,
        "test_loss_critic_unscaled": 6.0}
    assert "loss_critic_unscaled" not in loss_stats(losses, ["prover", "verifier"])  # no coefficient known

"""The pure-text trainers' statistics on three fixed rollouts, against values computed by hand.

Agents (prover, verifier), three rounds, one channel:

* A (label 1, datapoint 4): the verifier accepts in round 1 (right); round 2 is padding;
* B (label 0, datapoint 4): nobody decides, the episode is terminated in round 2 (wrong);
* C (label 0, datapoint 9): the verifier accepts in round 0 (wrong); rounds 1, 2 are padding.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from nip_core.environments.nested_array_dict import NestedArrayDict
from nip_core.trainers.pure_text_stats import accuracy_by_kind, rollout_stats


def rollout(*, y, datapoint, decision_at, decision, terminated_at, padding_from, rewards, retries, limits, said):
    t_max = 3
    arr = lambda fill, *shape: np.full((t_max, *shape), fill)  # noqa: E731
    done = np.array([t >= padding_from for t in range(t_max)])
    decisions = arr(2, 2)
    if decision_at is not None:
        decisions[decision_at, 1] = decision
    terminated = arr(False)
    if terminated_at is not None:
        terminated[terminated_at:] = True
    history = np.empty((t_max, t_max, 1), dtype=object)
    for t in range(t_max):
        for r in range(min(said, t + 1)):
            history[t, r, 0] = f"message {r}"
    return NestedArrayDict({
        "padding": done.copy(), "done": done, "next.terminated": terminated, "agents.decision": decisions,
        "next.agents.reward": np.array(rewards, dtype=float).T, "agents.retry_count": np.array(retries)[..., None],
        "agents.token_limit": np.array(limits)[..., None], "next.message_history": history,
        "y": arr(y), "datapoint_id": arr(datapoint),
    }, batch_size=(t_max,))


ROLLOUTS = [
    rollout(y=1, datapoint=4, decision_at=1, decision=1, terminated_at=None, padding_from=2,
            rewards=[[0, 1, 0], [0, 1, 0]], retries=[[2, 0], [0, 1], [0, 0]],
            limits=[[True, False], [False, False], [False, False]], said=2),
    rollout(y=0, datapoint=4, decision_at=None, decision=None, terminated_at=2, padding_from=3,
            rewards=[[0, 0, 0], [0, 0, -1]], retries=[[0, 0]] * 3, limits=[[False, False]] * 3, said=3),
    rollout(y=0, datapoint=9, decision_at=0, decision=1, terminated_at=None, padding_from=1,
            rewards=[[1, 0, 0], [-1, 0, 0]], retries=[[0, 1], [0, 0], [0, 0]], limits=[[False, False]] * 3, said=1),
]


def test_statistics_of_fixed_rollouts_are_computed_as_nip_computes_them():
    stats = rollout_stats(ROLLOUTS, ["prover", "verifier"], verifier_index=1)
    expected = {
        # episode rewards: prover (1, 0, 1), verifier (1, -1, -1); std with ddof 0
        "prover.mean_episode_reward": 2 / 3, "prover.std_episode_reward": math.sqrt(2) / 3,
        "verifier.mean_episode_reward": -1 / 3, "verifier.std_episode_reward": math.sqrt(8) / 3,
        # the mean retry count over the six steps whose done is false (2 + 0 + 0 + 0 + 0 + 0
        # for the prover, 0 + 1 + 0 + 0 + 0 + 1 for the verifier), token limits likewise
        "prover.retry_proportion": 2 / 6, "verifier.retry_proportion": 2 / 6,
        "prover.token_limit_proportion": 1 / 6, "verifier.token_limit_proportion": 0.0,
        # messages on channel 0: 2, 3, 1
        "mean_episode_length": 2.0, "std_episode_length": math.sqrt(2 / 3),
        # decisions 1, 2 (terminated), 1 against labels 1, 0, 0
        "mean_accuracy": 1 / 3, "std_accuracy": math.sqrt(2 / 9),
        "valid_decision_rate": 2 / 3,  # nipflow's: B timed out
        "worst_datapoint_accuracy": 0.0,  # datapoint 4: 0.5, datapoint 9: 0.0
        "mean_0_accuracy": 0.0, "std_0_accuracy": 0.0, "mean_1_accuracy": 1.0, "std_1_accuracy": 0.0,
        "mean_decision": 4 / 3, "std_decision": math.sqrt(2) / 3,
        # TP 1 (A), FP 1 (C), FN 0 (B timed out: not a reject)
        "precision": 0.5, "recall": 1.0,
    }
    assert stats.keys() == expected.keys()
    for key, value in expected.items():
        assert stats[key] == pytest.approx(value, abs=1e-9), key


def test_undefined_ratios_are_left_out_and_the_test_prefix_is_applied():
    # only B: no positive decision and no positive label
    stats = rollout_stats(ROLLOUTS[1:2], ["prover", "verifier"], verifier_index=1, prefix="test_")
    assert "test_precision" not in stats and "test_recall" not in stats and "test_mean_1_accuracy" not in stats
    assert stats["test_mean_accuracy"] == 0.0 and stats["verifier.test_mean_episode_reward"] == -1.0
    assert rollout_stats([], ["prover", "verifier"], 1) == {}


def test_accuracy_by_kind_counts_each_kind_and_leaves_out_rollouts_without_one():
    # decisions 1 (right), 2 (time-out: wrong), 1 (wrong) on labels 1, 0, 0
    stats = accuracy_by_kind(ROLLOUTS, 1, ["correct", "swap_operands", "swap_operands"], prefix="test_")
    assert stats == {"test_accuracy_by_kind.correct": 1.0, "test_count_by_kind.correct": 1.0,
                     "test_accuracy_by_kind.swap_operands": 0.0, "test_count_by_kind.swap_operands": 2.0}
    assert accuracy_by_kind(ROLLOUTS, 1, ["a", None, "a"]) == {"accuracy_by_kind.a": 0.5, "count_by_kind.a": 2.0}
    with pytest.raises(ValueError, match="2 kinds for 3 rollouts"):
        accuracy_by_kind(ROLLOUTS, 1, ["a", "b"])

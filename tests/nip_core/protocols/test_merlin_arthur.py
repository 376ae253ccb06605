"""Merlin-Arthur: seed-parity prover choice (docs/behaviour.md#b10), verifier in round 1, two-prover pay."""

from __future__ import annotations

import pytest
import torch

from nip_core.protocols import (
    CodeValidationMerlinArthurProtocol,
    MerlinArthurProtocol,
    MissingStepInputError,
)

from ._helpers import I, P, T, V, Row, make_handler, schedule, step

# [round][agent: prover0, prover1, verifier][channel: main]
EVEN_SEED = [
    [[0], [1], [0]],  # 0 prover1 (even seed)
    [[0], [0], [1]],  # 1 verifier
]
ODD_SEED = [
    [[1], [0], [0]],  # 0 prover0 (odd seed)
    [[0], [0], [1]],  # 1 verifier
]


@pytest.mark.parametrize("seed, table", [(0, EVEN_SEED), (4, EVEN_SEED), (65534, EVEN_SEED),
                                         (1, ODD_SEED), (7, ODD_SEED), (65535, ODD_SEED)])
def test_schedule_table_by_seed_parity(seed, table):
    h = make_handler("merlin_arthur")
    assert type(h) is MerlinArthurProtocol and not h.is_deterministic
    assert schedule(h, seed=seed) == table


def test_batched_mask_and_guess_mask():
    h = make_handler("merlin_arthur")
    rounds = torch.tensor([[0, 0], [1, 1], [2, 0]])
    seeds = torch.tensor([[10, 3], [10, 3], [5, 8]])
    assert h.get_active_agents_mask(rounds, seeds).int().tolist() == [
        [[[0], [1], [0]], [[1], [0], [0]]],
        [[[0], [0], [1]], [[0], [0], [1]]],
        [[[0], [0], [0]], [[0], [1], [0]]],  # round 2 is past the end: nobody
    ]
    assert h.get_verifier_guess_mask(rounds, seeds).int().tolist() == [[0, 0], [1, 1], [0, 0]]
    with pytest.raises(MissingStepInputError, match="seed"):
        h.get_active_agents_mask(rounds, None)


def test_metadata():
    h = make_handler("merlin_arthur", nip_protocol={"max_message_rounds": 6})
    assert h.agent_names == ["prover0", "prover1", "verifier"]
    assert h.message_channel_names == ["main"]
    assert h.agent_channel_visibility_mask.int().tolist() == [[1], [1], [1]]
    assert (h.max_message_rounds, h.min_message_rounds, h.max_verifier_questions) == (2, 1, 1)
    assert h.agent_first_active_round == {"prover0": 0, "prover1": 0, "verifier": 1}
    assert [h.can_agent_be_active("prover0", r, "main") for r in range(3)] == [True, False, False]
    assert [h.can_agent_be_active("verifier", r, "main") for r in range(3)] == [False, True, False]


def test_every_reward_case():
    h = make_handler("merlin_arthur")
    out = step(h, [
        Row(1, y=1, decision=1, seed=2),                # accept (correct): prover1 paid
        Row(1, y=0, decision=0, seed=3),                # reject (correct): prover0 paid
        Row(1, y=0, decision=1, seed=3),                # accept (incorrect)
        Row(1, y=1, decision=0, seed=2),                # reject (incorrect)
        Row(1, y=1, decision=2, seed=2),                # continue in the last round: terminated
        Row(0, y=1, decision=1, seed=2),                # provers' round: ignored
        Row(1, y=1, decision=0, seed=5, done=True),     # already done: still paid
    ])
    assert out.reward.tolist() == [[0, P, V], [P, 0, V], [0, P, I], [P, 0, I], [0, 0, T], [0, 0, 0],
                                   [P, 0, I]]
    assert out.shared_done.int().tolist() == [1, 1, 1, 1, 0, 0, 1]
    assert out.terminated.int().tolist() == [0, 0, 0, 0, 1, 0, 0]
    h = make_handler("merlin_arthur", common={"shared_reward": True})
    out = step(h, [Row(1, 1, 1), Row(1, 1, 0), Row(1, 1, 2), Row(0, 1, 1)])
    assert out.reward.tolist() == [[V, V, V], [I, I, I], [T, T, T], [0, 0, 0]]
    h = make_handler("merlin_arthur", common={"force_guess": "one"})
    out = step(h, [Row(1, 1, 2), Row(0, 1, 2)])
    assert out.reward.tolist() == [[0, 0, I], [0, 0, 0]]


def test_code_validation_fixed_stances():
    h = make_handler("merlin_arthur", scenario="code_validation", common={"randomize_prover_stance": True})
    assert type(h) is CodeValidationMerlinArthurProtocol and not h.stance_randomisable
    assert (h.default_stance("prover0"), h.default_stance("prover1")) == (0, 1)
    out = step(h, [Row(1, 1, 0, stance=1), Row(1, 1, 1, stance=0)])
    assert out.reward.tolist() == [[P, 0, I], [0, P, V]]

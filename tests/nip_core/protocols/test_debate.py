"""Debate: all schedule variants, visibility, and the two-prover reward rule."""

from __future__ import annotations

import pytest
import torch

from nip_core.protocols import CodeValidationDebateProtocol, DebateProtocol

from ._helpers import I, N, P, T, V, Row, make_handler, schedule, step
from ._two_prover_tables import SIMULTANEOUS_VERIFIER_FIRST, VARIANTS


@pytest.mark.parametrize("verifier_first, sequential, prover0_first, table, questions, first", VARIANTS)
def test_schedule_tables(verifier_first, sequential, prover0_first, table, questions, first):
    h = make_handler("debate", common={"verifier_first": verifier_first},
                     debate_protocol={"sequential": sequential, "prover0_first": prover0_first})
    assert type(h) is DebateProtocol
    assert h.active_agents_mask.int().tolist() == table
    assert schedule(h) == table
    assert h.max_verifier_questions == questions
    assert h.agent_first_active_round == first
    expected_guess = [int(any(row[2])) for row in table]
    assert h.get_verifier_guess_mask(torch.arange(8), None).int().tolist() == expected_guess


def test_reads_debate_protocol_only():
    h = make_handler("debate", debate_protocol={"max_message_rounds": 7, "min_message_rounds": 3},
                     nip_protocol={"max_message_rounds": 3}, mnip_protocol={"max_message_rounds": 5,
                                                                            "sequential": True})
    assert (h.max_message_rounds, h.min_message_rounds) == (7, 3)
    assert schedule(h) == SIMULTANEOUS_VERIFIER_FIRST[:7]


def test_metadata_and_visibility():
    h = make_handler("debate")
    assert h.agent_names == ["prover0", "prover1", "verifier"]
    assert h.prover_names == ["prover0", "prover1"] and h.verifier_names == ["verifier"]
    assert h.message_channel_names == ["prover0_channel", "prover1_channel"]
    # Debate provers see both channels.
    assert h.agent_channel_visibility_mask.int().tolist() == [[1, 1], [1, 1], [1, 1]]
    assert h.agent_visible_channels("prover0") == ["prover0_channel", "prover1_channel"]
    assert h.can_agent_be_active("prover0", 1, "prover0_channel")
    assert not h.can_agent_be_active("prover0", 1, "prover1_channel")
    assert h.stackelberg_sequence == (("verifier",), ("prover0", "prover1"))
    assert h.reward_mid_point_estimate("prover1") == P / 2


def test_every_reward_case_simultaneous():
    h = make_handler("debate")  # verifier on even rounds, last round 7 is the provers'
    out = step(h, [
        Row(0, y=1, decision=1),                    # accept (correct): prover1 paid
        Row(2, y=0, decision=0),                    # reject (correct): prover0 paid
        Row(4, y=0, decision=1),                    # accept (incorrect)
        Row(6, y=1, decision=0),                    # reject (incorrect)
        Row(2, y=1, decision=2),                    # no guess at its turn
        Row(1, y=1, decision=1),                    # provers' round: ignored
        Row(7, y=1, decision=2),                    # terminated at the last round
        Row(4, y=1, decision=0, done=True),         # already done: still paid
        Row(6, y=1, decision=2, done=True),         # already done, continue
    ])
    assert out.reward.tolist() == [
        [0, P, V], [P, 0, V], [0, P, I], [P, 0, I], [0, 0, N], [0, 0, 0], [0, 0, T], [P, 0, I], [0, 0, 0],
    ]
    done = [1, 1, 1, 1, 0, 0, 0, 1, 1]
    assert out.shared_done.int().tolist() == done
    assert out.agent_done.int().tolist() == [[d] * 3 for d in done]
    assert out.terminated.int().tolist() == [0, 0, 0, 0, 0, 0, 1, 0, 0]


def test_rewards_sequential_variants():
    # Verifier first, sequential: verifier rounds 0, 3, 6; round 7 (prover0's) terminates.
    h = make_handler("debate", debate_protocol={"sequential": True})
    out = step(h, [Row(3, 1, 1), Row(2, 1, 1), Row(6, 1, 2), Row(7, 1, 2), Row(6, 0, 0)])
    assert out.reward.tolist() == [[0, P, V], [0, 0, 0], [0, 0, N], [0, 0, T], [P, 0, V]]
    # Provers first, sequential, 9 rounds: verifier rounds 2, 5, 8; it owns the last round.
    h = make_handler("debate", common={"verifier_first": False},
                     debate_protocol={"sequential": True, "max_message_rounds": 9})
    assert h.max_verifier_questions == 3
    out = step(h, [Row(8, 1, 2), Row(8, 0, 0), Row(5, 0, 2), Row(4, 0, 0)])
    assert out.reward.tolist() == [[0, 0, T], [P, 0, V], [0, 0, N], [0, 0, 0]]
    assert out.terminated.int().tolist() == [1, 0, 0, 0]


def test_min_rounds_shared_reward_force_guess():
    h = make_handler("debate", debate_protocol={"sequential": True, "min_message_rounds": 4})
    out = step(h, [Row(0, 1, 1), Row(3, 1, 1)])  # decisions count from round 3
    assert out.reward.tolist() == [[0, 0, N], [0, P, V]]
    h = make_handler("debate", common={"shared_reward": True})
    out = step(h, [Row(0, 1, 1), Row(0, 1, 0), Row(2, 0, 2), Row(7, 0, 2), Row(1, 0, 0)])
    assert out.reward.tolist() == [[V, V, V], [I, I, I], [N, N, N], [T, T, T], [0, 0, 0]]
    h = make_handler("debate", common={"force_guess": "y"})
    out = step(h, [Row(0, 1, 2), Row(2, 0, 0), Row(3, 0, 2)])
    assert out.reward.tolist() == [[0, 0, I], [P, 0, V], [0, 0, 0]]


def test_code_validation_fixed_stances():
    common = {"randomize_prover_stance": True}  # debate stances cannot be randomised
    h = make_handler("debate", scenario="code_validation", common=common)
    assert type(h) is CodeValidationDebateProtocol and not h.stance_randomisable
    assert (h.default_stance("prover0"), h.default_stance("prover1")) == (0, 1)
    assert (h.agent_stance("prover0", 1), h.agent_stance("prover1", 0)) == (0, 1)
    out = step(h, [Row(0, 1, 0, stance=1), Row(0, 1, 1, stance=0), Row(2, 0, 2, stance=0)])
    assert out.reward.tolist() == [[P, 0, I], [0, P, V], [0, 0, N]]
    out = step(h, [Row(0, 0, 0)])  # no prover_stance needed
    assert out.reward.tolist() == [[P, 0, V]]

"""MNIP: own round limits, private channels, both provers paid on accept (docs/behaviour.md#b5, #b6)."""

from __future__ import annotations

import pytest

from nip_core.protocols import CodeValidationMnipProtocol, MnipProtocol

from ._helpers import I, N, P, T, V, Row, make_handler, schedule, step
from ._two_prover_tables import SIMULTANEOUS_VERIFIER_FIRST, VARIANTS


@pytest.mark.parametrize("verifier_first, sequential, prover0_first, table, questions, first", VARIANTS)
def test_schedule_tables(verifier_first, sequential, prover0_first, table, questions, first):
    h = make_handler("mnip", common={"verifier_first": verifier_first},
                     mnip_protocol={"sequential": sequential, "prover0_first": prover0_first})
    assert type(h) is MnipProtocol
    assert h.active_agents_mask.int().tolist() == table
    assert schedule(h) == table
    assert h.max_verifier_questions == questions
    assert h.agent_first_active_round == first


def test_reads_mnip_protocol_round_limits_and_schedule():
    h = make_handler("mnip", mnip_protocol={"max_message_rounds": 5, "min_message_rounds": 2},
                     nip_protocol={"max_message_rounds": 3}, debate_protocol={"max_message_rounds": 7,
                                                                              "sequential": True})
    assert (h.max_message_rounds, h.min_message_rounds) == (5, 2)
    assert schedule(h) == SIMULTANEOUS_VERIFIER_FIRST[:5]
    assert h.max_verifier_questions == 3


def test_private_channels():
    h = make_handler("mnip")
    assert h.agent_names == ["prover0", "prover1", "verifier"]
    assert h.message_channel_names == ["prover0_channel", "prover1_channel"]
    assert h.agent_channel_visibility_mask.int().tolist() == [[1, 0], [0, 1], [1, 1]]
    assert h.agent_visible_channels("prover1") == ["prover1_channel"]


def test_every_reward_case():
    h = make_handler("mnip")
    out = step(h, [
        Row(0, y=1, decision=1),                # correct accept: both provers paid
        Row(2, y=0, decision=0),                # correct reject: neither
        Row(4, y=0, decision=1),                # incorrect accept: both
        Row(6, y=1, decision=0),                # incorrect reject
        Row(2, y=1, decision=2),                # no guess
        Row(3, y=1, decision=1),                # provers' round
        Row(7, y=0, decision=2),                # terminated
        Row(4, y=0, decision=1, done=True),     # already done
    ])
    assert out.reward.tolist() == [
        [P, P, V], [0, 0, V], [P, P, I], [0, 0, I], [0, 0, N], [0, 0, 0], [0, 0, T], [P, P, I],
    ]
    assert out.shared_done.int().tolist() == [1, 1, 1, 1, 0, 0, 0, 1]
    assert out.terminated.int().tolist() == [0, 0, 0, 0, 0, 0, 1, 0]


def test_shared_reward_min_rounds_force_guess():
    h = make_handler("mnip", common={"shared_reward": True})
    out = step(h, [Row(0, 1, 1), Row(0, 1, 0), Row(2, 1, 2), Row(7, 1, 2)])
    assert out.reward.tolist() == [[V, V, V], [I, I, I], [N, N, N], [T, T, T]]
    h = make_handler("mnip", mnip_protocol={"min_message_rounds": 3}, nip_protocol={"min_message_rounds": 1})
    out = step(h, [Row(0, 1, 1), Row(2, 1, 1)])
    assert out.reward.tolist() == [[0, 0, N], [P, P, V]]
    h = make_handler("mnip", common={"force_guess": "zero"})
    out = step(h, [Row(0, 0, 2), Row(0, 0, 1)])
    assert out.reward.tolist() == [[0, 0, I], [P, P, I]]


def test_code_validation_both_provers_paid_on_their_stance():
    h = make_handler("mnip", scenario="code_validation")
    assert type(h) is CodeValidationMnipProtocol and h.stance_randomisable
    assert (h.default_stance("prover0"), h.default_stance("prover1")) == (1, 1)
    # Fixed (docs/behaviour.md#b5): a reject pays neither prover (the original paid prover0).
    out = step(h, [Row(0, 0, 0), Row(0, 1, 1), Row(0, 1, 0)])
    assert out.reward.tolist() == [[0, 0, V], [P, P, V], [0, 0, I]]
    h = make_handler("mnip", scenario="code_validation", common={"randomize_prover_stance": True})
    out = step(h, [Row(0, 0, 0, stance=0), Row(0, 1, 1, stance=0), Row(0, 1, 0, stance=1),
                   Row(0, 1, 1, stance=1)])
    assert out.reward.tolist() == [[P, P, V], [0, 0, V], [0, 0, I], [P, P, V]]

"""Solo verifier: decides alone in round 0; no decision there terminates (docs/behaviour.md#b7)."""

from __future__ import annotations

from nip_core.protocols import CodeValidationSoloVerifierProtocol, SoloVerifierProtocol

from ._helpers import I, T, V, Row, make_handler, schedule, step

# [round][agent: verifier][channel: main]
TABLE = [
    [[1]],  # 0 verifier
    [[0]],  # 1 nobody (shape-only round)
]


def test_schedule_table_and_metadata():
    h = make_handler("solo_verifier", nip_protocol={"max_message_rounds": 6})
    assert type(h) is SoloVerifierProtocol
    assert h.active_agents_mask.int().tolist() == TABLE
    assert schedule(h) == TABLE
    assert (h.max_message_rounds, h.min_message_rounds, h.max_verifier_questions) == (2, 1, 1)
    assert h.agent_names == ["verifier"] and h.prover_names == [] and h.message_channel_names == ["main"]
    assert h.agent_first_active_round == {"verifier": 0}
    assert h.stackelberg_sequence == (("verifier",),)


def test_every_reward_case_in_graph_isomorphism():
    h = make_handler("solo_verifier")
    out = step(h, [
        Row(0, y=1, decision=1),                 # correct
        Row(0, y=1, decision=0),                 # incorrect
        Row(0, y=0, decision=2),                 # no decision in round 0: terminated at once
        Row(1, y=0, decision=0),                 # round 1 (never reached normally): terminated
        Row(0, y=0, decision=0, done=True),      # already done: still paid
    ])
    assert out.reward.tolist() == [[V], [I], [T], [T], [V]]
    assert out.shared_done.int().tolist() == [1, 1, 0, 0, 1]
    assert out.terminated.int().tolist() == [0, 0, 1, 1, 0]


def test_shared_reward_and_force_guess_have_no_provers_to_pay():
    h = make_handler("solo_verifier", common={"shared_reward": True, "force_guess": "y"})
    out = step(h, [Row(0, 1, 2), Row(0, 0, 0)])
    assert out.reward.tolist() == [[I], [V]]
    assert out.terminated.int().tolist() == [0, 0]


def test_code_validation():
    h = make_handler("solo_verifier", scenario="code_validation")
    assert type(h) is CodeValidationSoloVerifierProtocol
    out = step(h, [Row(0, 1, 1), Row(0, 1, 2)])
    assert out.reward.tolist() == [[V], [T]]
    assert out.terminated.int().tolist() == [0, 1]

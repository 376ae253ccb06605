"""ADP: two fixed rounds, prover then verifier, whatever the NIP parameters say."""

from __future__ import annotations

import pytest
import torch

from nip_core.protocols import AdpProtocol, CodeValidationAdpProtocol, MissingStepInputError

from ._helpers import I, N, P, T, V, Row, make_handler, schedule, step

# [round][agent: prover, verifier][channel: main]
TABLE = [
    [[1], [0]],  # 0 prover
    [[0], [1]],  # 1 verifier
]


@pytest.mark.parametrize("verifier_first", [True, False])
def test_schedule_table_ignores_verifier_first_and_nip_rounds(verifier_first):
    h = make_handler("adp", common={"verifier_first": verifier_first},
                     nip_protocol={"max_message_rounds": 6, "min_message_rounds": 4})
    assert type(h) is AdpProtocol
    assert (h.max_message_rounds, h.min_message_rounds, h.max_verifier_questions) == (2, 1, 1)
    assert h.active_agents_mask.int().tolist() == TABLE
    assert schedule(h) == TABLE
    assert h.get_verifier_guess_mask(torch.tensor([0, 1]), None).tolist() == [False, True]
    assert h.agent_first_active_round == {"prover": 0, "verifier": 1}
    assert h.agent_names == ["prover", "verifier"] and h.message_channel_names == ["main"]


def test_every_reward_case():
    h = make_handler("adp", nip_protocol={"min_message_rounds": 4})  # nip min rounds not used
    out = step(h, [
        Row(1, y=1, decision=1),                    # correct accept
        Row(1, y=0, decision=1),                    # incorrect accept
        Row(1, y=0, decision=0),                    # correct reject
        Row(1, y=1, decision=0),                    # incorrect reject
        Row(1, y=1, decision=2),                    # continue in the last round: terminated
        Row(0, y=1, decision=1),                    # prover's round: ignored
        Row(0, y=0, decision=2),                    # prover's round
        Row(1, y=1, decision=0, done=True),         # already done: still paid
        Row(0, y=1, decision=2, terminated=True),   # already terminated
    ])
    assert out.reward.tolist() == [[P, V], [P, I], [0, V], [0, I], [0, T], [0, 0], [0, 0], [0, I], [0, 0]]
    assert out.shared_done.int().tolist() == [1, 1, 1, 1, 0, 0, 0, 1, 0]
    assert out.terminated.int().tolist() == [0, 0, 0, 0, 1, 0, 0, 0, 1]


def test_no_guess_reward_never_paid_in_adp():
    # The verifier's only turn is the last round, where continuing means termination.
    h = make_handler("adp")
    out = step(h, [Row(1, 0, 2)])
    assert out.reward.tolist() == [[0, T]] and out.terminated.tolist() == [True]
    assert N not in out.reward


def test_shared_reward_and_force_guess():
    h = make_handler("adp", common={"shared_reward": True})
    out = step(h, [Row(1, 1, 1), Row(1, 1, 2), Row(1, 1, 0), Row(0, 1, 1)])
    assert out.reward.tolist() == [[V, V], [T, T], [I, I], [0, 0]]
    h = make_handler("adp", common={"force_guess": "one"})
    out = step(h, [Row(1, 1, 2), Row(0, 1, 2), Row(1, 0, 0)])
    assert out.reward.tolist() == [[0, I], [0, 0], [0, V]]
    assert out.terminated.int().tolist() == [0, 0, 0]
    assert out.shared_done.int().tolist() == [1, 0, 1]


def test_code_validation_stance():
    h = make_handler("adp", scenario="code_validation")
    assert type(h) is CodeValidationAdpProtocol
    assert (h.default_stance("prover"), h.stance_randomisable) == (1, True)
    out = step(h, [Row(1, 1, 1), Row(1, 0, 0)])
    assert out.reward.tolist() == [[P, V], [0, V]]
    h = make_handler("adp", scenario="code_validation", common={"randomize_prover_stance": True})
    out = step(h, [Row(1, 1, 0, stance=0), Row(1, 0, 0, stance=1), Row(1, 1, 1, stance=1)])
    assert out.reward.tolist() == [[P, I], [0, V], [P, V]]
    with pytest.raises(MissingStepInputError):
        step(h, [Row(1, 1, 1)])

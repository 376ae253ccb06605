"""NIP: schedule tables, metadata and every reward case, all written out by hand."""

from __future__ import annotations

import pytest
import torch

from nip_core.protocols import (
    CodeValidationNipProtocol,
    MissingStepInputError,
    NipProtocol,
    ProtocolStepInput,
    UnknownAgentError,
    build_protocol_handler,
)

from ._helpers import I, N, P, T, V, Row, make_handler, make_params, schedule, step

# [round][agent: prover, verifier][channel: main]
VERIFIER_FIRST_8 = [
    [[0], [1]],  # 0 verifier
    [[1], [0]],  # 1 prover
    [[0], [1]],  # 2 verifier
    [[1], [0]],  # 3 prover
    [[0], [1]],  # 4 verifier
    [[1], [0]],  # 5 prover
    [[0], [1]],  # 6 verifier
    [[1], [0]],  # 7 prover
]
PROVER_FIRST_6 = [
    [[1], [0]],  # 0 prover
    [[0], [1]],  # 1 verifier
    [[1], [0]],  # 2 prover
    [[0], [1]],  # 3 verifier
    [[1], [0]],  # 4 prover
    [[0], [1]],  # 5 verifier
]


def test_verifier_first_schedule_table():
    h = make_handler("nip")
    assert type(h) is NipProtocol and h.is_deterministic
    assert h.active_agents_mask.int().tolist() == VERIFIER_FIRST_8
    assert schedule(h) == VERIFIER_FIRST_8
    assert h.get_verifier_guess_mask(torch.arange(8), None).int().tolist() == [1, 0, 1, 0, 1, 0, 1, 0]
    assert [h.can_agent_be_active("prover", r, "main") for r in range(4)] == [False, True, False, True]
    assert [h.can_agent_be_active_any_channel("verifier", r) for r in range(3)] == [True, False, True]


def test_prover_first_schedule_table_reads_nip_protocol_rounds():
    h = make_handler("nip", common={"verifier_first": False},
                     nip_protocol={"max_message_rounds": 6, "min_message_rounds": 2},
                     debate_protocol={"max_message_rounds": 3}, mnip_protocol={"max_message_rounds": 4})
    assert (h.max_message_rounds, h.min_message_rounds) == (6, 2)
    assert schedule(h) == PROVER_FIRST_6
    assert h.agent_first_active_round == {"prover": 0, "verifier": 1}


def test_metadata():
    h = make_handler("nip")
    assert h.agent_names == ["prover", "verifier"]
    assert (h.prover_names, h.prover_indices) == (["prover"], [0])
    assert (h.verifier_names, h.verifier_indices) == (["verifier"], [1])
    assert h.message_channel_names == ["main"] and h.num_message_channels == 1
    assert h.agent_channel_visibility == [("prover", "main"), ("verifier", "main")]
    assert h.agent_channel_visibility_mask.tolist() == [[True], [True]]
    assert (h.max_message_rounds, h.min_message_rounds) == (8, 1)
    assert h.agent_first_active_round == {"prover": 1, "verifier": 0}
    assert h.reward_mid_point_estimate("verifier") == (V + I) / 2 == -7.0
    assert h.reward_mid_point_estimate("prover") == P / 2 == 1.5
    assert h.stackelberg_sequence == (("verifier",), ("prover",))
    with pytest.raises(UnknownAgentError, match="'judge'"):
        h.reward_mid_point_estimate("judge")


@pytest.mark.parametrize(
    "verifier_first, max_rounds, expected",
    [(True, 8, 4), (False, 8, 4), (True, 5, 3), (False, 5, 2), (True, 1, 1), (False, 1, 0)],
)
def test_max_verifier_questions(verifier_first, max_rounds, expected):
    h = make_handler("nip", common={"verifier_first": verifier_first},
                     nip_protocol={"max_message_rounds": max_rounds})
    assert h.max_verifier_questions == expected


def test_every_reward_case_verifier_first():
    h = make_handler("nip")  # verifier on even rounds; the last round (7) is the prover's
    out = step(h, [
        Row(0, y=1, decision=1),                      # correct accept
        Row(2, y=0, decision=0),                      # correct reject
        Row(4, y=0, decision=1),                      # incorrect accept (prover still paid)
        Row(6, y=1, decision=0),                      # incorrect reject
        Row(2, y=1, decision=2),                      # its turn, continues: no-guess reward
        Row(1, y=1, decision=1),                      # not its turn: decision ignored
        Row(3, y=0, decision=2),                      # not its turn, continue
        Row(7, y=1, decision=2),                      # last round: terminated
        Row(7, y=1, decision=1),                      # last round, not its turn: terminated
        Row(4, y=1, decision=0, done=True),           # already done: still paid (docs/behaviour.md#b4)
        Row(4, y=1, decision=1, done=True),           # already done, correct
        Row(4, y=1, decision=2, done=True),           # already done, continue: no no-guess reward
        Row(7, y=0, decision=2, done=True),           # already done at last round: terminated
        Row(2, y=1, decision=2, terminated=True),     # already terminated: no no-guess reward
    ])
    assert out.reward.tolist() == [
        [P, V], [0, V], [P, I], [0, I], [0, N], [0, 0], [0, 0],
        [0, T], [0, T], [0, I], [P, V], [0, 0], [0, T], [0, 0],
    ]
    done = [1, 1, 1, 1, 0, 0, 0, 0, 0, 1, 1, 1, 1, 0]
    assert out.shared_done.int().tolist() == done
    assert out.terminated.int().tolist() == [0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 1, 1]
    assert out.agent_done.int().tolist() == [[d, d] for d in done]
    assert out.reward.dtype == torch.float32


def test_decisions_before_min_rounds_are_ignored():
    # min 4: decisions count from round 3 on.
    h = make_handler("nip", nip_protocol={"min_message_rounds": 4})
    out = step(h, [Row(0, 1, 1), Row(2, 0, 0), Row(4, 1, 1), Row(6, 0, 1)])
    assert out.reward.tolist() == [[0, N], [0, N], [P, V], [P, I]]
    assert out.shared_done.int().tolist() == [0, 0, 1, 1]
    # Prover first: the verifier's round 3 is exactly the first counting round.
    h = make_handler("nip", common={"verifier_first": False}, nip_protocol={"min_message_rounds": 4})
    out = step(h, [Row(1, 1, 1), Row(3, 1, 1), Row(3, 0, 0)])
    assert out.reward.tolist() == [[0, N], [P, V], [0, V]]
    assert out.shared_done.int().tolist() == [0, 1, 1]


def test_shared_reward_copies_the_verifier_reward():
    h = make_handler("nip", common={"shared_reward": True})
    out = step(h, [Row(0, 1, 1), Row(0, 0, 1), Row(2, 1, 2), Row(7, 1, 2), Row(1, 1, 1), Row(0, 0, 0)])
    assert out.reward.tolist() == [[V, V], [I, I], [N, N], [T, T], [0, 0], [V, V]]


@pytest.mark.parametrize("force, rows, rewards, done", [
    # force_guess decides only whether the decision counts; rewards use the raw decision.
    ("zero", [Row(0, 1, 2), Row(0, 0, 1), Row(0, 0, 0), Row(1, 1, 2), Row(7, 1, 2)],
     [[0, I], [P, I], [0, V], [0, 0], [0, T]], [1, 1, 1, 0, 0]),
    ("one", [Row(0, 1, 2), Row(0, 1, 0), Row(2, 1, 1), Row(3, 0, 2)],
     [[0, I], [0, I], [P, V], [0, 0]], [1, 1, 1, 0]),
    ("y", [Row(0, 1, 2), Row(0, 0, 2), Row(2, 0, 0), Row(4, 0, 1), Row(5, 1, 2)],
     [[0, I], [0, I], [0, V], [P, I], [0, 0]], [1, 1, 1, 1, 0]),
])
def test_force_guess(force, rows, rewards, done):
    h = make_handler("nip", common={"force_guess": force})
    out = step(h, rows)
    assert out.reward.tolist() == rewards
    assert out.shared_done.int().tolist() == done


def test_force_guess_respects_min_rounds():
    h = make_handler("nip", common={"force_guess": "zero"}, nip_protocol={"min_message_rounds": 4})
    out = step(h, [Row(0, 1, 2), Row(2, 1, 2), Row(4, 1, 2)])
    assert out.reward.tolist() == [[0, N], [0, N], [0, I]]
    assert out.shared_done.int().tolist() == [0, 0, 1]


def test_gi_environment_golden_step():
    """The reference GI ``_step`` test, at the protocol level (docs/behaviour.md#b13)."""
    hp = make_params("nip", common={"verifier_first": False, "prover_reward": 1.0},
                     nip_protocol={"max_message_rounds": 6})
    h = build_protocol_handler(hp)
    done = torch.tensor([0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0], dtype=torch.bool)
    decision = torch.tensor([[0, d] for d in [0, 0, 1, 2, 2, 2, 0, 0, 1, 1, 1, 1]])
    out = h.step_interaction_protocol(ProtocolStepInput(
        round=torch.arange(12) % 6,
        seed=torch.zeros(12, dtype=torch.long),
        y=torch.tensor([0, 0, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1]).unsqueeze(-1),  # (..., 1) as in the env
        decision=decision,
        done=done,
        agent_done=done.unsqueeze(-1).repeat(1, 2),
        terminated=torch.zeros(12, dtype=torch.bool),
    ))
    next_done = out.shared_done | out.terminated
    assert next_done.int().tolist() == [0, 1, 0, 0, 0, 1, 1, 1, 1, 1, 0, 1]
    assert out.reward.tolist() == [
        [0, 0], [0, 2], [0, 0], [0, 8], [0, 0], [0, -4],
        [0, 0], [0, -16], [0, 0], [1, -16], [0, 0], [1, 2],
    ]


def test_code_validation_stance_default_and_randomised():
    h = make_handler("nip", scenario="code_validation")
    assert type(h) is CodeValidationNipProtocol
    assert h.default_stance("prover") == 1 and h.stance_randomisable
    with pytest.raises(UnknownAgentError):
        h.default_stance("verifier")
    # Not randomised: the datapoint stance is ignored, the prover argues accept.
    out = step(h, [Row(0, 0, 0, stance=0), Row(0, 1, 1, stance=0), Row(2, 0, 1, stance=0)])
    assert out.reward.tolist() == [[0, V], [P, V], [P, I]]

    h = make_handler("nip", scenario="code_validation", common={"randomize_prover_stance": True})
    assert h.agent_stance("prover", 0) == 0
    out = step(h, [
        Row(0, 1, 0, stance=0),  # verifier rejects (wrongly); prover argued reject: paid
        Row(0, 0, 1, stance=0),  # verifier accepts; prover argued reject: unpaid
        Row(0, 1, 1, stance=1),
        Row(2, 0, 0, stance=1),
        Row(1, 0, 0, stance=0),  # prover's round: no decision
        Row(2, 1, 2, stance=0),  # no guess
        Row(7, 1, 2, stance=1),  # terminated
    ])
    assert out.reward.tolist() == [[P, I], [0, I], [P, V], [0, V], [0, 0], [0, N], [0, T]]
    with pytest.raises(MissingStepInputError, match="prover_stance"):
        step(h, [Row(0, 1, 1)])

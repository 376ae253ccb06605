"""multi_channel_test: three channels with partial visibility; steppable (docs/behaviour.md#b7)."""

from __future__ import annotations

from nip_core.protocols import MultiChannelTestProtocol

from ._helpers import I, N, T, V, Row, make_handler, schedule, step

# [round][agent: prover0, prover1, prover2, verifier][channel: main, prover0_verifier, prover_chat]
TABLE = [
    [[0, 0, 1], [1, 0, 0], [0, 0, 0], [0, 0, 0]],  # 0 main: prover1, chat: prover0
    [[0, 1, 0], [0, 0, 1], [1, 0, 0], [0, 0, 0]],  # 1 main: prover2, p0v: prover0, chat: prover1
    [[0, 0, 0], [0, 0, 0], [0, 0, 1], [1, 1, 0]],  # 2 main+p0v: verifier, chat: prover2
    [[0, 0, 1], [1, 0, 0], [0, 0, 0], [0, 0, 0]],  # 3
    [[0, 1, 0], [0, 0, 1], [1, 0, 0], [0, 0, 0]],  # 4
    [[0, 0, 0], [0, 0, 0], [0, 0, 1], [1, 1, 0]],  # 5
    [[0, 0, 1], [1, 0, 0], [0, 0, 0], [0, 0, 0]],  # 6
    [[0, 1, 0], [0, 0, 1], [1, 0, 0], [0, 0, 0]],  # 7
]


def test_schedule_table_visibility_and_metadata():
    h = make_handler("multi_channel_test")
    assert type(h) is MultiChannelTestProtocol
    assert h.active_agents_mask.int().tolist() == TABLE
    assert schedule(h) == TABLE
    assert h.agent_channel_visibility_mask.int().tolist() == [[1, 1, 1], [1, 0, 1], [1, 0, 1], [1, 1, 0]]
    assert (h.max_message_rounds, h.min_message_rounds) == (8, 2)
    assert h.max_verifier_questions == 2  # verifier rounds 2 and 5 (docs/behaviour.md#b8)
    assert h.agent_first_active_round == {"prover0": 0, "prover1": 0, "prover2": 1, "verifier": 2}


def test_rewards_no_prover_pay():
    h = make_handler("multi_channel_test", common={"shared_reward": True})
    out = step(h, [
        Row(2, y=1, decision=1),   # correct
        Row(5, y=1, decision=0),   # incorrect
        Row(5, y=1, decision=2),   # no guess
        Row(0, y=1, decision=1),   # not its turn (and before min rounds)
        Row(7, y=1, decision=2),   # terminated
    ])
    assert out.reward.tolist() == [[0, 0, 0, V], [0, 0, 0, I], [0, 0, 0, N], [0, 0, 0, 0], [0, 0, 0, T]]
    assert out.shared_done.int().tolist() == [1, 1, 0, 0, 0]

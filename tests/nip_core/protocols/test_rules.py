"""The shared decision, termination and reward rules, and the base-class machinery."""

from __future__ import annotations

import pytest
import torch

from nip_core.parameters import CommonProtocolParameters
from nip_core.protocols import (
    DeterministicSingleVerifierProtocolHandler,
    ProtocolError,
    ProtocolSpecificationError,
    ProtocolStepInput,
    UnknownAgentError,
)
from nip_core.protocols import rules

from ._helpers import I, N, P, T, V, Row, make_handler, make_params, step, step_input

B = torch.tensor


def test_apply_force_guess():
    decision, y = B([0, 1, 2]), B([1, 0, 1])
    assert rules.apply_force_guess(decision, y, None).tolist() == [0, 1, 2]
    assert rules.apply_force_guess(decision, y, "zero").tolist() == [0, 0, 0]
    assert rules.apply_force_guess(decision, y, "one").tolist() == [1, 1, 1]
    assert rules.apply_force_guess(decision, y, "y").tolist() == [1, 0, 1]
    with pytest.raises(ValueError, match="force_guess"):
        rules.apply_force_guess(decision, y, "two")


def test_decision_made_mask():
    made = rules.decision_made_mask(
        B([0, 1, 2, 3, 1]), B([1, 1, 1, 1, 0]), B([True, True, False, True, True]), B([1, 2, 0, 0, 1]),
        min_message_rounds=2, force_guess=None)
    # round 0 < min-1; decision 2; not its turn; counts; round 1 == min-1 counts
    assert made.tolist() == [False, False, False, True, True]
    forced = rules.decision_made_mask(
        B([0, 1, 1]), B([1, 1, 1]), B([True, True, False]), B([2, 2, 2]), min_message_rounds=2,
        force_guess="zero")
    assert forced.tolist() == [False, True, False]


def test_new_terminated_mask():
    terminated = rules.new_terminated_mask(B([5, 6, 7, 7]), B([False, False, False, True]), max_message_rounds=7)
    assert terminated.tolist() == [False, True, True, False]


def test_verifier_reward_cases_and_precedence():
    common = CommonProtocolParameters(verifier_reward=V, verifier_incorrect_penalty=I,
                                      verifier_terminated_penalty=T, verifier_no_guess_reward=N)
    t, f = True, False
    reward = rules.verifier_reward(
        y=B([1, 1, 0, 0, 1, 1, 1, 1]),
        decision=B([1, 0, 2, 2, 2, 2, 2, 1]),
        decision_made=B([t, t, f, f, f, f, f, t]),
        guess_mask=B([t, t, t, f, t, t, t, t]),
        shared_done=B([t, t, f, f, t, f, f, t]),
        terminated=B([f, f, t, f, f, t, f, f]),
        terminated_now=B([f, f, t, f, f, f, f, f]),
        common=common,
    )
    # correct, incorrect, terminated (beats no-guess), not its turn, done (no no-guess),
    # already terminated (no no-guess), no guess, correct
    assert reward.tolist() == [V, I, T, 0, 0, 0, N, V]


def test_stance_prover_rewards():
    decision, made = B([0, 1, 1, 2]), B([True, True, False, True])
    fixed = rules.stance_prover_rewards(decision=decision, decision_made=made, stances=B([0, 1]), prover_reward=P)
    assert fixed.tolist() == [[P, 0], [0, P], [0, 0], [0, 0]]
    per_row = rules.stance_prover_rewards(decision=decision, decision_made=made,
                                          stances=B([[1], [1], [1], [0]]), prover_reward=P)
    assert per_row.tolist() == [[0], [P], [0], [0]]
    assert rules.default_prover_stances(1, "x") == (1,)
    assert rules.default_prover_stances(2, "x") == (0, 1)
    with pytest.raises(NotImplementedError, match="three_provers"):
        rules.default_prover_stances(3, "three_provers")


def test_arbitrary_leading_dims_match_flat_batch():
    h = make_handler("nip")
    rows = [Row(r, y, d, done=bool(k % 3 == 0)) for k, (r, y, d) in enumerate(
        [(0, 1, 1), (1, 0, 2), (2, 1, 2), (3, 1, 0), (6, 0, 0), (7, 1, 2)])]
    flat = step(h, rows)
    inp = step_input(h, rows)
    shaped = ProtocolStepInput(
        round=inp.round.view(2, 3), seed=inp.seed.view(2, 3), y=inp.y.view(2, 3),
        decision=inp.decision.view(2, 3, 2), done=inp.done.view(2, 3),
        agent_done=inp.agent_done.view(2, 3, 2), terminated=inp.terminated.view(2, 3))
    out = h.step_interaction_protocol(shaped)
    assert out.reward.shape == (2, 3, 2) and out.agent_done.shape == (2, 3, 2) and out.shared_done.shape == (2, 3)
    assert torch.equal(out.reward.view(6, 2), flat.reward)
    assert torch.equal(out.terminated.view(6), flat.terminated)
    assert h.get_active_agents_mask(torch.zeros(4, 5, dtype=torch.long), None).shape == (4, 5, 2, 1)
    assert h.get_active_agents_mask(torch.tensor(3), None).tolist() == [[True], [False]]


def test_prover_decisions_are_ignored():
    h = make_handler("debate")
    rows = [Row(0, 1, 1), Row(1, 1, 2), Row(2, 0, 2), Row(7, 0, 2)]
    a = step(h, rows)
    b = step(h, [Row(r.round, r.y, r.decision, other=1) for r in rows])
    c = step(h, [Row(r.round, r.y, r.decision, other=2) for r in rows])
    assert torch.equal(a.reward, b.reward) and torch.equal(a.reward, c.reward)
    assert torch.equal(a.shared_done, b.shared_done) and torch.equal(a.shared_done, c.shared_done)


def test_incoming_agent_done_is_kept():
    h = make_handler("debate")
    inp = step_input(h, [Row(1, 1, 2), Row(0, 1, 1)])
    inp.agent_done = B([[True, False, False], [False, False, False]])
    out = h.step_interaction_protocol(inp)
    assert out.agent_done.tolist() == [[True, False, False], [True, True, True]]
    assert out.shared_done.tolist() == [False, True]


def test_label_with_trailing_dim_and_input_checks():
    h = make_handler("nip")
    inp = step_input(h, [Row(0, 1, 1), Row(0, 0, 1)])
    inp.y = inp.y.unsqueeze(-1)
    assert step(h, [Row(0, 1, 1), Row(0, 0, 1)]).reward.tolist() == h.step_interaction_protocol(inp).reward.tolist()
    inp.decision = B([[2, 2, 2], [2, 2, 2]])
    with pytest.raises(ProtocolError, match="'decision' has 3 agents"):
        h.step_interaction_protocol(inp)


def test_rounds_past_the_end_have_nobody_active():
    h = make_handler("nip", nip_protocol={"max_message_rounds": 3})
    assert h.get_active_agents_mask(B([2, 3, 9]), None).int().tolist() == [[[0], [1]], [[0], [0]], [[0], [0]]]


def test_unknown_names():
    h = make_handler("nip")
    with pytest.raises(UnknownAgentError, match="'judge'"):
        h.can_agent_be_active("judge", 0, "main")
    with pytest.raises(UnknownAgentError, match="channel 'side'"):
        h.can_agent_be_active("prover", 0, "side")


def test_stackelberg_sequence():
    h = make_handler("debate", spg={"stackelberg_sequence": [["verifier"], ["prover1"], ["prover0"]]})
    assert h.stackelberg_sequence == (("verifier",), ("prover1",), ("prover0",))
    assert make_handler("debate").stackelberg_sequence == (("verifier",), ("prover0", "prover1"))
    for bad in ([["verifier"], ["prover0"]], [["verifier", "prover0"], ["prover0", "prover1"]],
                [["verifier", "judge"], ["prover0", "prover1"]], [["verifier", "prover0", "prover1"], []]):
        with pytest.raises(ProtocolSpecificationError, match="stackelberg_sequence"):
            _ = make_handler("debate", spg={"stackelberg_sequence": bad}).stackelberg_sequence


class _Base(DeterministicSingleVerifierProtocolHandler):
    max_message_rounds, min_message_rounds = 3, 1


def test_agent_active_in_invisible_channel_is_refused():
    class Leaky(_Base):
        AGENTS, CHANNELS = ("prover", "verifier"), ("main", "private")
        VISIBILITY = (("prover", "main"), ("verifier", "main"), ("verifier", "private"))

        def is_agent_active(self, agent_name, round, channel_name):
            return round == 2 and agent_name == "prover" and channel_name == "private"

    with pytest.raises(ProtocolSpecificationError, match="'prover' is active in round 2 in channel 'private'"):
        Leaky(make_params("nip"))


def test_visibility_of_unknown_channel_is_refused():
    class Typo(_Base):
        AGENTS, CHANNELS = ("prover", "verifier"), ("main",)
        VISIBILITY = (("prover", "main"), ("verifier", "mian"))

        def is_agent_active(self, agent_name, round, channel_name):
            return False

    with pytest.raises(ProtocolSpecificationError, match="'mian'"):
        Typo(make_params("nip"))


def test_three_provers_need_their_own_reward_rule():
    class Crowd(_Base):
        AGENTS, CHANNELS = ("prover0", "prover1", "prover2", "verifier"), ("main",)
        VISIBILITY = tuple((a, "main") for a in AGENTS)

        def is_agent_active(self, agent_name, round, channel_name):
            return agent_name == "verifier"

    h = Crowd(make_params("nip"))
    with pytest.raises(NotImplementedError, match="one or two provers"):
        step(h, [Row(0, 1, 1)])
    assert make_handler("nip", common={"shared_reward": True}).prover_indices == [0]
    assert Crowd(make_params("nip", common={"shared_reward": True})).step_interaction_protocol(
        step_input(h, [Row(0, 1, 1)])).reward.tolist() == [[V, V, V, V]]

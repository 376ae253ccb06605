"""Reply parsing and chat-prompt construction of the code-validation protocols."""

from __future__ import annotations

import numpy as np
import pytest

from nip_core.parameters import HyperParameters
from nip_core.protocols import build_protocol_handler
from nip_core.scenarios.code_validation.text_protocols import (
    History,
    InvalidResponseError,
    build_chat_messages,
    channel_order,
    last_round_message,
    parse_reply,
)


def handler(protocol: str = "nip", **kw):
    return build_protocol_handler(HyperParameters(scenario="code_validation", trainer="pure_text_ei",
                                                  dataset="test", interaction_protocol=protocol, **kw))


@pytest.mark.parametrize("reply,decision", [("Decision: accept", 1), ("  decision:REJECT because", 0),
                                            ("Decision: accept\nmore", 1)])
def test_verifier_decisions(reply, decision):
    parsed = parse_reply(handler(), "verifier", reply, ["main"], may_decide=True, must_decide=False)
    assert parsed.decision == decision and parsed.messages == {"main": None}


def test_verifier_question_single_channel_keeps_the_question():
    parsed = parse_reply(handler(), "verifier", "Question for Expert: is n=1 handled?", ["main"],
                         may_decide=True, must_decide=False)
    assert parsed.decision == 2 and parsed.messages == {"main": "is n=1 handled?"}


def test_verifier_must_decide_in_its_last_round():
    with pytest.raises(InvalidResponseError, match="must reply"):
        parse_reply(handler(), "verifier", "Question for Expert: x", ["main"], may_decide=True, must_decide=True)


def test_multi_channel_verifier_needs_every_header():
    h = handler("debate")
    reply = "Question for Expert0: a?\nQuestion for Expert1: b?"
    parsed = parse_reply(h, "verifier", reply, ["prover0_channel", "prover1_channel"],
                         may_decide=True, must_decide=False)
    assert parsed.messages == {"prover0_channel": "a?", "prover1_channel": "b?"}
    with pytest.raises(InvalidResponseError, match="Question for Expert1:"):
        parse_reply(h, "verifier", "Question for Expert0: a?", ["prover0_channel", "prover1_channel"],
                    may_decide=True, must_decide=False)


@pytest.mark.parametrize("reply", ["", "   ", "Decision: accept"])
def test_invalid_prover_replies(reply):
    with pytest.raises(InvalidResponseError):
        parse_reply(handler(), "prover", reply, ["main"], may_decide=False, must_decide=False)


def test_prover_reply_goes_to_its_active_channels():
    parsed = parse_reply(handler(), "prover", " Answer: fine \n", ["main"], may_decide=False, must_decide=False)
    assert parsed.messages == {"main": "Answer: fine"} and parsed.decision == 2


def _history(h, rounds):
    r, c, a = h.max_message_rounds, len(h.message_channel_names), len(h.agent_names)
    mh = np.empty((r, c), dtype=object)
    ids = np.full((r, c), -1)
    raw = np.empty((r, a), dtype=object)
    for rnd, (agent, ch, text) in enumerate(rounds):
        i = h.agent_names.index(agent)
        mh[rnd, h.message_channel_names.index(ch)] = text
        ids[rnd, h.message_channel_names.index(ch)] = i
        raw[rnd, i] = text
    return History(mh, ids, raw, seed=5, question="Q?", solution="print(1)", prover_stance=1)


def test_nip_verifier_prompt_order_roles_and_last_round_message():
    h = handler(nip_protocol={"max_message_rounds": 4})
    hist = _history(h, [("verifier", "main", "Question for Expert: a"), ("prover", "main", "Answer: b")])
    msgs = build_chat_messages(h, "nip", "verifier", hist, max_response_words=50, until_round=2)
    assert [m["role"] for m in msgs] == ["system", "assistant", "user", "system"]
    assert msgs[2] == {"role": "user", "content": "Answer: b", "name": "Expert"}
    assert msgs[3]["content"] == last_round_message()  # round 2 is the verifier's last active round
    prover = build_chat_messages(h, "nip", "prover", hist, max_response_words=50, until_round=1)
    assert [m["role"] for m in prover] == ["system", "user"]
    assert "convince the Verifier to accept" in prover[0]["content"]


def test_debate_channel_order_is_seeded_and_varies_by_round():
    h = handler("debate")
    orders = {tuple(channel_order(h, "debate", "verifier", 5, r)) for r in range(8)}
    assert orders == {("prover0_channel", "prover1_channel"), ("prover1_channel", "prover0_channel")}
    assert channel_order(h, "debate", "verifier", 5, 3) == channel_order(h, "debate", "verifier", 5, 3)


@pytest.mark.parametrize("protocol", ["debate", "mnip"])
def test_the_verifier_sees_the_provers_channels_shuffled_only_when_asked(protocol):
    """``randomize_channel_order`` decides the order of the provers' messages in the verifier's prompt."""

    def user_turns(randomize: bool) -> list[str]:
        h = handler(protocol, **{f"{protocol}_protocol": {"max_message_rounds": 8, "randomize_channel_order": randomize}})
        r, c, a = h.max_message_rounds, len(h.message_channel_names), len(h.agent_names)
        mh, ids, raw = np.empty((r, c), dtype=object), np.full((r, c), -1), np.empty((r, a), dtype=object)
        for rnd in range(6):
            for prover, channel, text in (("prover0", "prover0_channel", f"A{rnd}"), ("prover1", "prover1_channel", f"B{rnd}")):
                mh[rnd, h.message_channel_names.index(channel)] = text
                ids[rnd, h.message_channel_names.index(channel)] = h.agent_names.index(prover)
        hist = History(mh, ids, raw, seed=5, question="Q?", solution="print(1)")
        return [m["content"] for m in build_chat_messages(h, protocol, "verifier", hist, max_response_words=50,
                                                          until_round=6) if m["role"] == "user"]

    in_order = [x for rnd in range(6) for x in (f"A{rnd}", f"B{rnd}")]
    assert user_turns(False) == in_order
    shuffled = user_turns(True)
    assert sorted(shuffled) == sorted(in_order) and shuffled != in_order
    assert shuffled == user_turns(True)  # seeded by the episode

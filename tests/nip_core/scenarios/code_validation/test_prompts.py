"""Every protocol's prompts render and carry the format markers of the local model."""

from __future__ import annotations

import pytest

from nipflow_llm_server.policy.formats import detect_format
from nip_core.parameters import HyperParameters
from nip_core.protocols import build_protocol_handler
from nip_core.scenarios.code_validation.text_protocols import build_system_prompt, last_round_message

PROTOCOLS = ["nip", "adp", "debate", "mnip", "merlin_arthur", "solo_verifier"]


def handler(protocol):
    return build_protocol_handler(HyperParameters(scenario="code_validation", trainer="pure_text_ei",
                                                  dataset="test", interaction_protocol=protocol))


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_prompts_render_with_question_solution_and_markers(protocol):
    h = handler(protocol)
    for agent in h.agent_names:
        text = build_system_prompt(h, protocol, agent, "QUESTION-TEXT", "print('SOL')", 1, 77)
        assert "QUESTION-TEXT" in text and "print('SOL')" in text and "$" not in text
        fmt = detect_format([{"role": "system", "content": text}])
        if agent == "verifier":
            assert fmt.decision
        else:
            assert not fmt.decision and fmt.answer
            stance = "accept" if h.agent_stance(agent, 1) == 1 else "reject"
            assert f"convince the Verifier to {stance}" in text


def test_verifier_question_headers_per_channel():
    text = build_system_prompt(handler("mnip"), "mnip", "verifier", "q", "s", None, 10)
    assert "Question for Expert0:" in text and "Question for Expert1:" in text


def test_last_round_message_restricts_to_decisions():
    fmt = detect_format([{"role": "system", "content": "Question for Expert: x\nDecision: accept"},
                         {"role": "system", "content": last_round_message()}])
    assert fmt.decision and fmt.must_decide

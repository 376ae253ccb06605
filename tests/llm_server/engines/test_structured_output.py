"""Structured output through the official ``openai`` client: OpenAI's ``response_format``
and vLLM's ``guided_regex`` / ``guided_choice``, enforced by the transformers engine with
llguidance while it samples (nipflow_llm_server/engines/constraints.py).

``nipflow-tiny-lm`` knows no language (untrained it answers random bytes), so every reply in
the required form here is the constraint's doing.
"""

from __future__ import annotations

import json
import re

import openai
import pytest

from nipflow_llm_server.testing import local_api_server

pytestmark = [pytest.mark.e2e]
TINY = "nipflow-tiny-lm"
PROMPT = [{"role": "system", "content": "Decide."}, {"role": "user", "name": "Prover", "content": "x = 1"}]
DECISION = {"type": "object", "additionalProperties": False, "required": ["decision", "confidence"],
            "properties": {"decision": {"enum": ["accept", "reject"]}, "confidence": {"type": "integer", "minimum": 1, "maximum": 5}}}


def ask(client, max_tokens=48, **kw):
    return client.chat.completions.create(model=TINY, messages=PROMPT, seed=3, max_tokens=max_tokens, **kw)


def test_untrained_the_tiny_model_writes_none_of_the_forms(tiny_client):
    replies = [c.message.content for c in ask(tiny_client, n=8, temperature=1.0).choices]
    assert not any(r in ("accept", "reject") or re.fullmatch(r"Decision: (accept|reject)", r) for r in replies)


def test_a_json_schema_holds_every_sampled_reply(tiny_client):
    reply = ask(tiny_client, n=6, temperature=1.0,
                response_format={"type": "json_schema", "json_schema": {"name": "decision", "schema": DECISION}})
    for choice in reply.choices:
        value = json.loads(choice.message.content)
        assert set(value) == {"decision", "confidence"} and value["decision"] in ("accept", "reject")
        assert value["confidence"] in range(1, 6)
    assert {c.finish_reason for c in reply.choices} == {"stop"}


def test_a_choice_and_a_regex_are_what_comes_back_and_seeds_still_repeat(tiny_client):
    choices = ["accept", "reject", "ask the prover"]
    picked = ask(tiny_client, n=8, temperature=1.0, extra_body={"guided_choice": choices})
    assert all(c.message.content in choices and c.finish_reason == "stop" for c in picked.choices)
    again = ask(tiny_client, n=8, temperature=1.0, extra_body={"guided_choice": choices})
    assert [c.message.content for c in again.choices] == [c.message.content for c in picked.choices]
    decided = ask(tiny_client, n=4, temperature=1.0, extra_body={"guided_regex": r"Decision: (accept|reject)"})
    assert all(re.fullmatch(r"Decision: (accept|reject)", c.message.content) for c in decided.choices)
    assert decided.usage.completion_tokens == sum(len(c.message.content.encode()) for c in decided.choices)


@pytest.mark.parametrize("kw, param, words", [
    ({"extra_body": {"guided_regex": "(unclosed"}}, "guided_regex", "unclosed group"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format", "schema"),
    ({"response_format": {"type": "yaml"}}, "response_format", "'json_schema'"),
    ({"extra_body": {"guided_choice": []}}, "guided_choice", "non-empty"),
    ({"response_format": {"type": "json_object"}, "extra_body": {"guided_regex": "a"}}, "guided_regex", "one output"),
])
def test_a_bad_constraint_is_a_400_naming_the_field(tiny_client, kw, param, words):
    with pytest.raises(openai.BadRequestError) as caught:
        ask(tiny_client, **kw)
    assert caught.value.body["param"] == param and words in caught.value.body["message"]


def test_plain_text_format_is_no_constraint_and_the_selection_engine_refuses_a_schema(tiny_client, tmp_path):
    assert ask(tiny_client, response_format={"type": "text"}, max_tokens=4).choices[0].finish_reason == "length"
    with local_api_server(tmp_path) as server:
        client = server.client(max_retries=0)
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model="gpt-4o-mini", messages=PROMPT,
                                           response_format={"type": "json_object"})
    assert caught.value.body["param"] == "response_format"
    assert "not supported by the selection engine" in caught.value.body["message"]


def test_a_verifiers_decision_turn_is_held_to_its_form_where_the_server_offers_it(tiny_client):
    from nip_core.agents.pure_text import PureTextWholeAgent
    from nip_core.parameters import CodeValidationAgentParameters

    entry = tiny_client.models.retrieve(TINY)
    assert entry.model_extra["capabilities"]["structured_output"] is True

    def replies(setting: str, decision: bool) -> list[str]:
        params = CodeValidationAgentParameters(model_name=TINY, decision_constraint=setting, max_tokens_per_message=24)
        agent = PureTextWholeAgent("verifier", params, lambda: tiny_client, lambda: TINY)
        return [agent.generate(PROMPT, seed=s, decision=decision)[0] for s in range(6)]

    decided = {"Decision: accept", "Decision: reject"}
    assert set(replies("auto", decision=True)) <= decided
    assert set(replies("on", decision=True)) <= decided
    assert not set(replies("off", decision=True)) & decided  # the untrained model alone never writes one
    assert not set(replies("auto", decision=False)) & decided  # other rounds are not constrained


def test_a_verifiers_question_turn_is_held_to_its_question_lines_and_parses(tiny_client):
    """The untrained tiny model never writes a 'Question for Prover:' line alone (so every
    question turn of a real small model used to be re-sampled up to 20 times)."""
    from nip_core.agents.pure_text import PureTextWholeAgent
    from nip_core.parameters import CodeValidationAgentParameters, HyperParameters
    from nip_core.protocols import build_protocol_handler
    from nip_core.scenarios.code_validation.text_protocols import (
        InvalidResponseError, parse_reply, question_form, question_headers,
    )

    for protocol, n_channels in (("nip", 1), ("mnip", 2)):
        hp = HyperParameters(scenario="code_validation", trainer="pure_text_ei", dataset="test", interaction_protocol=protocol)
        handler = build_protocol_handler(hp)
        channels = [ch for ch, _ in question_headers(handler, "verifier")]
        assert len(channels) == n_channels
        form = question_form(handler, "verifier", channels, max_response_words=20)  # 160 characters of questions

        def replies(setting: str) -> list[str]:
            params = CodeValidationAgentParameters(model_name=TINY, decision_constraint=setting,
                                                   max_tokens_per_message=250)
            agent = PureTextWholeAgent("verifier", params, lambda: tiny_client, lambda: TINY)
            return [agent.generate(PROMPT, seed=s, form=form)[0] for s in range(4)]

        def parses(text: str) -> bool:
            try:
                parse_reply(handler, "verifier", text, channels, may_decide=True, must_decide=False)
                return True
            except InvalidResponseError:
                return False

        assert all(parses(t) for t in replies("auto")), protocol
        assert not any(parses(t) for t in replies("off")), protocol


def test_on_is_refused_for_a_prover_and_named():
    from pydantic import ValidationError

    from nip_core.parameters import HyperParameters

    with pytest.raises(ValidationError, match=r"agents\.prover\.decision_constraint: 'on'.*prover"):
        HyperParameters(scenario="code_validation", trainer="pure_text_ei", dataset="test",
                        agents={"prover": {"decision_constraint": "on"}})
    ok = HyperParameters(scenario="code_validation", trainer="pure_text_ei", dataset="test",
                         agents={"verifier": {"decision_constraint": "on"}})
    assert ok.agent_params("verifier").decision_constraint == "on"

"""The forms :class:`TextActor` holds the verifier's turns to (``decision_constraint``).

A decision in a round before ``min_message_rounds - 1`` is ignored by the protocol (nip's
rule, kept) and the verifier then sends nothing; so the form of such a round offers only the
question lines, and a constrained verifier always asks before it may decide.
"""

from __future__ import annotations

import re

import pytest

from nip_core.parameters import HyperParameters
from nip_core.protocols import build_protocol_handler
from nip_core.scenarios.code_validation.dataset import CodeValidationDataset
from nip_core.scenarios.code_validation.environment import CodeValidationEnvironment
from nip_core.trainers.pure_text_rollouts import TextActor


class RecordingAgent:
    """Replies what the form allows (deciding where it may), and records what it was asked for."""

    def __init__(self, name: str, calls: list):
        self.name, self.calls = name, calls

    def generate(self, prompt, seed=None, *, decision=False, form=None):
        self.calls.append((self.name, decision, form))
        if self.name == "prover":
            return "It is correct: the loop covers every index.", "stop", 10
        if decision or (form is not None and re.fullmatch(form, "Decision: accept")):
            return "Decision: accept", "stop", 3
        return "Question for Expert: what does the loop do?", "stop", 8


@pytest.mark.parametrize("min_rounds, expected", [
    # (round, agent, forced decision, the form accepts a decision, the form accepts a question)
    (3, [(0, "verifier", False, False, True), (1, "prover", False, None, None), (2, "verifier", True, None, None)]),
    (1, [(0, "verifier", False, True, True)]),  # a decision counts from round 0: it decides at once
])
def test_a_decision_the_protocol_would_ignore_is_not_offered(min_rounds, expected):
    hp = HyperParameters(scenario="code_validation", trainer="pure_text_ei", dataset="nipflow-cv",
                         interaction_protocol="nip",
                         nip_protocol={"max_message_rounds": 4, "min_message_rounds": min_rounds})
    handler = build_protocol_handler(hp)
    data = CodeValidationDataset.from_name(hp.dataset, "test", max_size=1)
    env = CodeValidationEnvironment(handler, data)
    calls: list = []
    actor = TextActor(env, {a: RecordingAgent(a, calls) for a in env.agent_names}, "nip", hp)
    rollout = env.run_episode(env.reset(data[0], seed=5, datapoint_id=0), actor)

    def accepts(form, text):
        return None if form is None else re.fullmatch(form, text) is not None

    seen = [(r, name, decision, accepts(form, "Decision: accept"), accepts(form, "Question for Expert: why?"))
            for r, (name, decision, form) in enumerate(calls)]
    assert seen == expected
    assert int(rollout["agents.decision"][len(calls) - 1, env.agent_names.index("verifier")]) == 1

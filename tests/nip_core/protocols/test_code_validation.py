"""The code-validation mixin: stances, randomisation switch, checks."""

from __future__ import annotations

import pytest

from nip_core.protocols import (
    CodeValidationProtocolMixin,
    MissingStepInputError,
    NipProtocol,
    ProtocolSpecificationError,
    UnknownAgentError,
    ZeroKnowledgeProtocol,
    ZeroKnowledgeUnsupportedError,
)

from ._helpers import make_handler, make_params

STANCES = {
    "nip": ({"prover": 1}, True),
    "adp": ({"prover": 1}, True),
    "mnip": ({"prover0": 1, "prover1": 1}, True),
    "debate": ({"prover0": 0, "prover1": 1}, False),
    "merlin_arthur": ({"prover0": 0, "prover1": 1}, False),
    "solo_verifier": ({}, False),
}


@pytest.mark.parametrize("protocol", list(STANCES))
@pytest.mark.parametrize("randomize", [False, True])
def test_stances(protocol, randomize):
    h = make_handler(protocol, scenario="code_validation", common={"randomize_prover_stance": randomize})
    defaults, randomisable = STANCES[protocol]
    assert isinstance(h, CodeValidationProtocolMixin)
    assert {p: h.default_stance(p) for p in h.prover_names} == defaults
    assert h.stance_randomisable is randomisable
    assert h.uses_randomised_stance is (randomisable and randomize)
    assert not h.can_be_zero_knowledge
    for prover in h.prover_names:
        expected = 0 if h.uses_randomised_stance else defaults[prover]
        assert h.agent_stance(prover, 0) == expected
    with pytest.raises(UnknownAgentError):
        h.default_stance("verifier")


def test_randomised_stance_needs_the_datapoint_stance():
    h = make_handler("nip", scenario="code_validation", common={"randomize_prover_stance": True})
    with pytest.raises(MissingStepInputError, match="'prover'"):
        h.agent_stance("prover")


def test_default_stances_must_cover_the_provers():
    class Broken(CodeValidationProtocolMixin, NipProtocol):
        DEFAULT_STANCES = {"prover0": 1}

    with pytest.raises(ProtocolSpecificationError, match="DEFAULT_STANCES"):
        Broken(make_params("nip", scenario="code_validation"))


def test_code_validation_classes_cannot_be_zero_knowledge():
    with pytest.raises(ZeroKnowledgeUnsupportedError):
        ZeroKnowledgeProtocol(make_params("nip"), type(make_handler("nip", scenario="code_validation")))

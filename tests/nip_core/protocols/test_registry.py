"""Registry: keys, scenario-specific lookup with generic fallback, duplicates, building."""

from __future__ import annotations

import pytest

from nip_core.protocols import (
    PROTOCOL_HANDLER_REGISTRY,
    AdpProtocol,
    CodeValidationAdpProtocol,
    CodeValidationDebateProtocol,
    CodeValidationMerlinArthurProtocol,
    CodeValidationMnipProtocol,
    CodeValidationNipProtocol,
    CodeValidationSoloVerifierProtocol,
    DebateProtocol,
    DuplicateProtocolHandlerError,
    MerlinArthurProtocol,
    MnipProtocol,
    MultiChannelTestProtocol,
    NipProtocol,
    SoloVerifierProtocol,
    UnknownProtocolError,
    ZeroKnowledgeProtocol,
    build_protocol_handler,
    get_protocol_handler_class,
    register_protocol_handler,
)

from ._helpers import make_params

GENERIC = {"nip": NipProtocol, "adp": AdpProtocol, "debate": DebateProtocol, "mnip": MnipProtocol,
           "merlin_arthur": MerlinArthurProtocol, "solo_verifier": SoloVerifierProtocol,
           "multi_channel_test": MultiChannelTestProtocol}
CODE_VALIDATION = {"nip": CodeValidationNipProtocol, "adp": CodeValidationAdpProtocol,
                   "debate": CodeValidationDebateProtocol, "mnip": CodeValidationMnipProtocol,
                   "merlin_arthur": CodeValidationMerlinArthurProtocol,
                   "solo_verifier": CodeValidationSoloVerifierProtocol}


def test_registered_keys():
    expected = {(p, None): c for p, c in GENERIC.items()}
    expected |= {(p, "code_validation"): c for p, c in CODE_VALIDATION.items()}
    assert {k: v for k, v in PROTOCOL_HANDLER_REGISTRY.items() if k in expected} == expected
    assert set(expected) <= set(PROTOCOL_HANDLER_REGISTRY)


@pytest.mark.parametrize("protocol", list(GENERIC))
def test_lookup_and_build_per_scenario(protocol):
    assert get_protocol_handler_class(protocol) is GENERIC[protocol]
    assert get_protocol_handler_class(protocol, "graph_isomorphism") is GENERIC[protocol]
    cv_class = CODE_VALIDATION.get(protocol, GENERIC[protocol])  # multi_channel_test falls back
    assert get_protocol_handler_class(protocol, "code_validation") is cv_class
    assert type(build_protocol_handler(make_params(protocol))) is GENERIC[protocol]
    assert type(build_protocol_handler(make_params(protocol, scenario="code_validation"))) is cv_class
    zk = build_protocol_handler(make_params(protocol, common={"zero_knowledge": True}))
    assert type(zk) is ZeroKnowledgeProtocol and type(zk.base_protocol) is GENERIC[protocol]


def test_unknown_protocol():
    with pytest.raises(UnknownProtocolError, match="'telepathy'"):
        get_protocol_handler_class("telepathy", "graph_isomorphism")


def test_duplicate_registration_raises_and_scenario_class_wins():
    key_generic, key_scenario = ("test_only_protocol", None), ("test_only_protocol", "graph_isomorphism")
    try:
        register_protocol_handler("test_only_protocol")(NipProtocol)
        register_protocol_handler("test_only_protocol", scenario="graph_isomorphism")(AdpProtocol)
        assert get_protocol_handler_class("test_only_protocol", "graph_isomorphism") is AdpProtocol
        assert get_protocol_handler_class("test_only_protocol", "code_validation") is NipProtocol
        with pytest.raises(DuplicateProtocolHandlerError, match="test_only_protocol"):
            register_protocol_handler("test_only_protocol")(NipProtocol)
        with pytest.raises(DuplicateProtocolHandlerError):
            register_protocol_handler("test_only_protocol", scenario="graph_isomorphism")(DebateProtocol)
        assert PROTOCOL_HANDLER_REGISTRY[key_scenario] is AdpProtocol
    finally:
        PROTOCOL_HANDLER_REGISTRY.pop(key_generic, None)
        PROTOCOL_HANDLER_REGISTRY.pop(key_scenario, None)
    with pytest.raises(DuplicateProtocolHandlerError, match="NipProtocol"):
        register_protocol_handler("nip")(DebateProtocol)

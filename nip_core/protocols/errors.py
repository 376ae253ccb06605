"""Exceptions raised by the protocol handlers; each names the protocol, agent or field."""

from __future__ import annotations

from nip_core.errors import NipflowError


class ProtocolError(NipflowError):
    """Base class of every protocol-handler error."""


class ProtocolSpecificationError(ProtocolError, ValueError):
    """A protocol definition is inconsistent (e.g. an agent speaks in a channel it cannot see)."""


class UnknownAgentError(ProtocolError, ValueError):
    """An agent or channel name that the protocol does not have."""

    def __init__(self, protocol: str, name: str, known: list[str], what: str = "agent"):
        self.protocol = protocol
        self.name = name
        super().__init__(f"protocol {protocol}: unknown {what} {name!r} (known: {known})")


class UnknownProtocolError(ProtocolError, ValueError):
    """No handler is registered for ``(protocol, scenario)`` nor for ``(protocol, None)``."""

    def __init__(self, protocol: str, scenario: str | None, known: list[tuple[str, str | None]]):
        self.protocol = protocol
        self.scenario = scenario
        super().__init__(
            f"no protocol handler registered for interaction_protocol={protocol!r} "
            f"(scenario={scenario!r}); registered keys: {known}"
        )


class DuplicateProtocolHandlerError(ProtocolError, ValueError):
    """A ``(protocol, scenario)`` key was registered twice."""


class MissingStepInputError(ProtocolError, ValueError):
    """A step input field that this protocol needs (``prover_stance``, logits) is ``None``."""


class ZeroKnowledgeUnsupportedError(ProtocolError, NotImplementedError):
    """The zero-knowledge wrapper cannot be built for this protocol or scenario."""

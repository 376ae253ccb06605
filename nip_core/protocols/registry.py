"""Registry of protocol handlers, keyed by ``(protocol, scenario)``.

A handler registered for a scenario wins over the generic one (``scenario=None``)::

    @register_protocol_handler("nip")
    class NipProtocol(DeterministicSingleVerifierProtocolHandler): ...

    @register_protocol_handler("nip", scenario="code_validation")
    class CodeValidationNipProtocol(CodeValidationProtocolMixin, NipProtocol): ...
"""

from __future__ import annotations

from typing import Callable, TypeVar

from nip_core.parameters import HyperParameters
from nip_core.protocols.base import ProtocolHandler
from nip_core.protocols.errors import DuplicateProtocolHandlerError, UnknownProtocolError

PROTOCOL_HANDLER_REGISTRY: dict[tuple[str, str | None], type[ProtocolHandler]] = {}

H = TypeVar("H", bound=type[ProtocolHandler])


def register_protocol_handler(name: str, scenario: str | None = None) -> Callable[[H], H]:
    """Class decorator registering a handler under ``(name, scenario)``.

    Raises
    ------
    DuplicateProtocolHandlerError
        If the key is already registered.
    """

    def decorator(cls: H) -> H:
        key = (name, scenario)
        if key in PROTOCOL_HANDLER_REGISTRY:
            raise DuplicateProtocolHandlerError(
                f"protocol handler key {key} is already registered to "
                f"{PROTOCOL_HANDLER_REGISTRY[key].__qualname__}; cannot register {cls.__qualname__}"
            )
        PROTOCOL_HANDLER_REGISTRY[key] = cls
        return cls

    return decorator


def get_protocol_handler_class(protocol: str, scenario: str | None = None) -> type[ProtocolHandler]:
    """The class for ``(protocol, scenario)``, else for ``(protocol, None)``.

    Raises
    ------
    UnknownProtocolError
        If neither key is registered.
    """
    for key in ((protocol, scenario), (protocol, None)):
        if key in PROTOCOL_HANDLER_REGISTRY:
            return PROTOCOL_HANDLER_REGISTRY[key]
    known = sorted(PROTOCOL_HANDLER_REGISTRY, key=lambda k: (k[0], k[1] or ""))
    raise UnknownProtocolError(protocol, scenario, known)


def build_protocol_handler(hyper_params: HyperParameters) -> ProtocolHandler:
    """The handler of ``hyper_params.interaction_protocol`` for its scenario.

    Wrapped in :class:`ZeroKnowledgeProtocol` when ``protocol_common.zero_knowledge``.
    """
    cls = get_protocol_handler_class(hyper_params.interaction_protocol, hyper_params.scenario)
    if hyper_params.protocol_common.zero_knowledge:
        from nip_core.protocols.zero_knowledge import ZeroKnowledgeProtocol

        return ZeroKnowledgeProtocol(hyper_params, base_protocol_cls=cls)
    return cls(hyper_params)

"""NIP (prover-verifier game) and ADP (abstract decision problem, Anil et al. 2021).

One prover and one verifier alternate on a single ``main`` channel.
"""

from __future__ import annotations

from typing import ClassVar

from nip_core.parameters.protocols import NipProtocolParameters
from nip_core.protocols.base import DeterministicSingleVerifierProtocolHandler
from nip_core.protocols.registry import register_protocol_handler


@register_protocol_handler("nip")
class NipProtocol(DeterministicSingleVerifierProtocolHandler):
    """Prover and verifier alternate on ``main``.

    ``protocol_common.verifier_first``: verifier on even rounds, prover on odd; otherwise
    the reverse. Round limits: ``nip_protocol``. Prover paid on accept.
    """

    AGENTS = ("prover", "verifier")
    CHANNELS = ("main",)
    VISIBILITY = (("prover", "main"), ("verifier", "main"))

    @property
    def protocol_params(self) -> NipProtocolParameters:
        return self.hyper_params.nip_protocol

    @property
    def verifier_first(self) -> bool:
        return self.protocol_common.verifier_first

    def is_agent_active(self, agent_name: str, round: int, channel_name: str) -> bool:
        verifier_parity = 0 if self.verifier_first else 1
        if agent_name == self.VERIFIER_NAME:
            return round % 2 == verifier_parity
        return round % 2 != verifier_parity


@register_protocol_handler("adp")
class AdpProtocol(NipProtocol):
    """Two rounds: the prover speaks, then the verifier decides.

    ``verifier_first`` is always False and the round limits are fixed (min 1, max 2),
    whatever the parameters say.
    """

    MAX_MESSAGE_ROUNDS: ClassVar[int] = 2
    MIN_MESSAGE_ROUNDS: ClassVar[int] = 1

    @property
    def verifier_first(self) -> bool:
        return False



"""Solo verifier: the verifier decides alone in round 0.

``max_message_rounds`` is 2 (the original needed a second round to dodge a numpy
StringDType shape bug; kept so that rollouts have the same shape) but the episode always
ends in round 0: it is terminated at once if the verifier does not decide
(``terminated_now = ~decision_made``). Fixed (docs/behaviour.md#b7): the step works in every scenario
(the original's generic prover-reward hook had the wrong signature); there are no provers,
so no prover rewards.
"""

from __future__ import annotations

from typing import ClassVar

from torch import Tensor

from nip_core.protocols.base import DeterministicSingleVerifierProtocolHandler
from nip_core.protocols.registry import register_protocol_handler


@register_protocol_handler("solo_verifier")
class SoloVerifierProtocol(DeterministicSingleVerifierProtocolHandler):
    """One verifier on ``main``, active in round 0 only. Rounds: min 1, max 2."""

    AGENTS = ("verifier",)
    CHANNELS = ("main",)
    VISIBILITY = (("verifier", "main"),)

    MAX_MESSAGE_ROUNDS: ClassVar[int] = 2
    MIN_MESSAGE_ROUNDS: ClassVar[int] = 1

    def is_agent_active(self, agent_name: str, round: int, channel_name: str) -> bool:
        return round == 0

    def _new_terminated_mask(self, round: Tensor, decision_made: Tensor) -> Tensor:
        # The only decision turn is round 0, so no decision there ends the episode.
        return ~decision_made

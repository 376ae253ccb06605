"""A test-only protocol with three provers and three partly private channels.

Used to check that agents see exactly their visible channels. Schedule (``r % 3``):

=================  =========  =========  =========
channel            0          1          2
=================  =========  =========  =========
main               prover1    prover2    verifier
prover0_verifier   --         prover0    verifier
prover_chat        prover0    prover1    prover2
=================  =========  =========  =========

Fixed (docs/behaviour.md#b7): it can be stepped (the original's prover-reward hook had the wrong
signature); provers get no reward. ``max_verifier_questions`` is counted from the
schedule (2 verifier turns in 8 rounds; the original hard-coded 4), see docs/behaviour.md#b8.
"""

from __future__ import annotations

from typing import ClassVar

from torch import Tensor

from nip_core.protocols.base import DeterministicSingleVerifierProtocolHandler
from nip_core.protocols.registry import register_protocol_handler
from nip_core.protocols.step import ProtocolStepInput


@register_protocol_handler("multi_channel_test")
class MultiChannelTestProtocol(DeterministicSingleVerifierProtocolHandler):
    """Three provers, one verifier, three channels; rounds: min 2, max 8."""

    AGENTS = ("prover0", "prover1", "prover2", "verifier")
    CHANNELS = ("main", "prover0_verifier", "prover_chat")
    VISIBILITY = (
        ("prover0", "main"),
        ("prover1", "main"),
        ("prover2", "main"),
        ("verifier", "main"),
        ("prover0", "prover0_verifier"),
        ("verifier", "prover0_verifier"),
        ("prover0", "prover_chat"),
        ("prover1", "prover_chat"),
        ("prover2", "prover_chat"),
    )

    SCHEDULE: ClassVar[dict[str, tuple[str | None, str | None, str | None]]] = {
        "main": ("prover1", "prover2", "verifier"),
        "prover0_verifier": (None, "prover0", "verifier"),
        "prover_chat": ("prover0", "prover1", "prover2"),
    }

    MAX_MESSAGE_ROUNDS: ClassVar[int] = 8
    MIN_MESSAGE_ROUNDS: ClassVar[int] = 2

    def is_agent_active(self, agent_name: str, round: int, channel_name: str) -> bool:
        return self.SCHEDULE[channel_name][round % 3] == agent_name

    def _include_prover_rewards(
        self, reward: Tensor, decision_made: Tensor, verifier_decision: Tensor, inp: ProtocolStepInput
    ) -> None:
        """No prover rewards (test-only protocol)."""

"""Merlin-Arthur classifiers (Wäldchen et al. 2022): one random prover speaks, then the verifier.

Round 0: exactly one prover writes to ``main`` -- prover1 if the episode seed is even,
prover0 if it is odd (kept, docs/behaviour.md#b10: the original ties the choice to seed parity, so
it is reproducible from the seed). Round 1: the verifier decides. The schedule depends on
the seed, so the mask is computed per row rather than looked up.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from nip_core.protocols.base import SingleVerifierProtocolHandler
from nip_core.protocols.errors import MissingStepInputError
from nip_core.protocols.registry import register_protocol_handler


@register_protocol_handler("merlin_arthur")
class MerlinArthurProtocol(SingleVerifierProtocolHandler):
    """Two provers (prover0 argues reject, prover1 accept), one verifier, one channel.

    Prover0 is paid on reject, prover1 on accept. Rounds: min 1, max 2.
    """

    AGENTS = ("prover0", "prover1", "verifier")
    CHANNELS = ("main",)
    VISIBILITY = (("prover0", "main"), ("prover1", "main"), ("verifier", "main"))

    MAX_MESSAGE_ROUNDS: ClassVar[int] = 2
    MIN_MESSAGE_ROUNDS: ClassVar[int] = 1
    MAX_VERIFIER_QUESTIONS: ClassVar[int] = 1

    @property
    def max_verifier_questions(self) -> int:
        return self.MAX_VERIFIER_QUESTIONS

    def get_active_agents_mask(self, round: Tensor, seed: Tensor | None) -> Tensor:
        """Bool ``(..., agent, 1)``; needs the per-episode ``seed``."""
        if seed is None:
            raise MissingStepInputError(
                f"protocol {self.display_name}: the active-agents mask depends on the episode seed; got None"
            )
        prover1_speaks = seed % 2 == 0
        first_round = round == 0
        by_agent = [first_round & ~prover1_speaks, first_round & prover1_speaks, round == 1]
        return torch.stack(by_agent, dim=-1).unsqueeze(-1)

    def can_agent_be_active(self, agent_name: str, round: int, channel_name: str) -> bool:
        """Either prover may speak in round 0 (depending on the seed); the verifier in round 1."""
        self._check_agent(agent_name)
        self._check_channel(channel_name)
        if agent_name == self.VERIFIER_NAME:
            return round == 1
        return round == 0

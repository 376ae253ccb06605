"""Debate (Irving et al. 2018) and MNIP (multi-prover NIP): two provers, one verifier.

Each prover writes only to its own channel ``prover{i}_channel``; the verifier writes to
both at once. The schedule cycles through turns:

* simultaneous, verifier first: verifier | both provers;
* simultaneous, provers first: both provers | verifier;
* sequential, verifier first: verifier | first prover | second prover;
* sequential, provers first: first prover | second prover | verifier;

where ``prover0_first`` picks the first prover. Debate provers see both channels and are
paid for opposite decisions (prover0 reject, prover1 accept); MNIP provers see only
their own channel and are both paid on accept.
"""

from __future__ import annotations

from abc import ABC

import torch
from torch import Tensor

from nip_core.parameters.protocols import DebateProtocolParameters, MnipProtocolParameters
from nip_core.protocols.base import DeterministicSingleVerifierProtocolHandler
from nip_core.protocols.registry import register_protocol_handler
from nip_core.protocols.step import ProtocolStepInput

PROVERS = ("prover0", "prover1")


def two_prover_turns(
    *, verifier_first: bool, sequential: bool, prover0_first: bool
) -> tuple[frozenset[str], ...]:
    """The cycle of turns; turn ``round % len(cycle)`` is the set of agents that speak."""
    first, second = PROVERS if prover0_first else PROVERS[::-1]
    verifier = frozenset({"verifier"})
    provers = [frozenset({first}), frozenset({second})] if sequential else [frozenset(PROVERS)]
    return (verifier, *provers) if verifier_first else (*provers, verifier)


class TwoProverProtocol(DeterministicSingleVerifierProtocolHandler, ABC):
    """Shared schedule of debate and MNIP; subclasses name their parameter group."""

    AGENTS = ("prover0", "prover1", "verifier")
    CHANNELS = ("prover0_channel", "prover1_channel")

    @property
    def protocol_params(self) -> DebateProtocolParameters | MnipProtocolParameters:
        raise NotImplementedError

    @property
    def verifier_first(self) -> bool:
        return self.protocol_common.verifier_first

    @property
    def turns(self) -> tuple[frozenset[str], ...]:
        params = self.protocol_params
        return two_prover_turns(verifier_first=self.verifier_first, sequential=params.sequential,
                                prover0_first=params.prover0_first)

    def is_agent_active(self, agent_name: str, round: int, channel_name: str) -> bool:
        turns = self.turns
        if agent_name not in turns[round % len(turns)]:
            return False
        # The verifier addresses both provers at once; a prover only writes to its own channel.
        return agent_name == self.VERIFIER_NAME or channel_name == f"{agent_name}_channel"


@register_protocol_handler("debate")
class DebateProtocol(TwoProverProtocol):
    """Debate: both provers see both channels; prover0 paid on reject, prover1 on accept.

    Round limits and ``sequential``/``prover0_first`` come from ``debate_protocol``.
    """

    VISIBILITY = (
        ("prover0", "prover0_channel"),
        ("prover0", "prover1_channel"),
        ("prover1", "prover0_channel"),
        ("prover1", "prover1_channel"),
        ("verifier", "prover0_channel"),
        ("verifier", "prover1_channel"),
    )

    @property
    def protocol_params(self) -> DebateProtocolParameters:
        return self.hyper_params.debate_protocol


@register_protocol_handler("mnip")
class MnipProtocol(TwoProverProtocol):
    """MNIP: each prover sees only its own channel; both provers are paid on accept.

    Round limits and ``sequential``/``prover0_first`` come from ``mnip_protocol``
    (fixed, docs/behaviour.md#b6: the original read ``nip_protocol``'s round limits).
    """

    VISIBILITY = (
        ("prover0", "prover0_channel"),
        ("prover1", "prover1_channel"),
        ("verifier", "prover0_channel"),
        ("verifier", "prover1_channel"),
    )

    @property
    def protocol_params(self) -> MnipProtocolParameters:
        return self.hyper_params.mnip_protocol

    def _prover_reward_stances(self, inp: ProtocolStepInput) -> Tensor:
        # Both provers argue for acceptance.
        return torch.tensor((1, 1))

"""Code-validation variants of the protocols: provers argue for a stance.

At this layer the only difference from the generic protocols is how provers are paid:
each prover is paid ``prover_reward`` iff the verifier's decision is made and equals the
prover's stance (``shared_reward`` still copies the verifier's reward). A prover's stance
is the datapoint's ``prover_stance`` when the protocol allows randomising it (nip, adp,
mnip) and ``protocol_common.randomize_prover_stance`` is set; otherwise its default
stance (:attr:`CodeValidationProtocolMixin.DEFAULT_STANCES`).

So one prover (nip, adp) is paid when the verifier agrees with its stance; debate and
merlin_arthur pay prover0 on reject and prover1 on accept; MNIP's provers both argue
"accept" and are both paid on accept (fixed, docs/behaviour.md#b5: the original paid prover0 on reject).

The prompt layer (templates, parsing) builds on :class:`CodeValidationProtocolMixin`.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from nip_core.parameters import HyperParameters
from nip_core.protocols.base import SingleVerifierProtocolHandler
from nip_core.protocols.debate import DebateProtocol, MnipProtocol
from nip_core.protocols.errors import (
    MissingStepInputError,
    ProtocolSpecificationError,
    UnknownAgentError,
)
from nip_core.protocols.merlin_arthur import MerlinArthurProtocol
from nip_core.protocols.nip import AdpProtocol, NipProtocol
from nip_core.protocols.registry import register_protocol_handler
from nip_core.protocols.solo_verifier import SoloVerifierProtocol
from nip_core.protocols.step import ProtocolStepInput

ACCEPT = 1
REJECT = 0


class CodeValidationProtocolMixin(SingleVerifierProtocolHandler):
    """Stance-based prover pay; mix in before a single-verifier protocol class.

    Subclasses set ``DEFAULT_STANCES`` (prover name -> 0 reject / 1 accept, for every
    prover) and ``stance_randomisable``.
    """

    DEFAULT_STANCES: ClassVar[dict[str, int]] = {}
    stance_randomisable: ClassVar[bool] = False
    # Zero-knowledge needs message logits, which text agents do not produce.
    can_be_zero_knowledge: ClassVar[bool] = False

    def __init__(self, hyper_params: HyperParameters):
        super().__init__(hyper_params)
        if set(self.DEFAULT_STANCES) != set(self.prover_names):
            raise ProtocolSpecificationError(
                f"protocol {self.display_name}: DEFAULT_STANCES names {sorted(self.DEFAULT_STANCES)} but "
                f"the provers are {self.prover_names}"
            )

    def default_stance(self, agent_name: str) -> int:
        """The decision ``agent_name`` argues for when stances are not randomised.

        Raises
        ------
        UnknownAgentError
            If ``agent_name`` is not a prover of this protocol.
        """
        if agent_name not in self.DEFAULT_STANCES:
            raise UnknownAgentError(self.display_name, agent_name, list(self.DEFAULT_STANCES), "prover")
        return self.DEFAULT_STANCES[agent_name]

    @property
    def uses_randomised_stance(self) -> bool:
        """Provers argue for the datapoint's ``prover_stance`` rather than their default."""
        return self.stance_randomisable and self.protocol_common.randomize_prover_stance

    def agent_stance(self, agent_name: str, prover_stance: int | None = None) -> int:
        """The stance a prover argues for on a datapoint (for prompts).

        Parameters
        ----------
        prover_stance : int, optional
            The datapoint's stance; required when :attr:`uses_randomised_stance`.
        """
        default = self.default_stance(agent_name)
        if not self.uses_randomised_stance:
            return default
        if prover_stance is None:
            raise MissingStepInputError(
                f"protocol {self.display_name}: protocol_common.randomize_prover_stance is set, so the "
                f"datapoint's prover_stance is needed for {agent_name!r}"
            )
        return int(prover_stance)

    def _prover_reward_stances(self, inp: ProtocolStepInput) -> Tensor:
        if not self.uses_randomised_stance:
            return torch.tensor([self.default_stance(p) for p in self.prover_names])
        if inp.prover_stance is None:
            raise MissingStepInputError(
                f"protocol {self.display_name}: protocol_common.randomize_prover_stance is set, so the "
                f"step input needs prover_stance (...)"
            )
        # Every prover argues for the datapoint's stance.
        return inp.prover_stance.unsqueeze(-1)


@register_protocol_handler("nip", scenario="code_validation")
class CodeValidationNipProtocol(CodeValidationProtocolMixin, NipProtocol):
    DEFAULT_STANCES = {"prover": ACCEPT}
    stance_randomisable = True


@register_protocol_handler("adp", scenario="code_validation")
class CodeValidationAdpProtocol(CodeValidationProtocolMixin, AdpProtocol):
    DEFAULT_STANCES = {"prover": ACCEPT}
    stance_randomisable = True


@register_protocol_handler("debate", scenario="code_validation")
class CodeValidationDebateProtocol(CodeValidationProtocolMixin, DebateProtocol):
    DEFAULT_STANCES = {"prover0": REJECT, "prover1": ACCEPT}
    stance_randomisable = False


@register_protocol_handler("mnip", scenario="code_validation")
class CodeValidationMnipProtocol(CodeValidationProtocolMixin, MnipProtocol):
    DEFAULT_STANCES = {"prover0": ACCEPT, "prover1": ACCEPT}
    stance_randomisable = True


@register_protocol_handler("merlin_arthur", scenario="code_validation")
class CodeValidationMerlinArthurProtocol(CodeValidationProtocolMixin, MerlinArthurProtocol):
    DEFAULT_STANCES = {"prover0": REJECT, "prover1": ACCEPT}
    stance_randomisable = False


@register_protocol_handler("solo_verifier", scenario="code_validation")
class CodeValidationSoloVerifierProtocol(CodeValidationProtocolMixin, SoloVerifierProtocol):
    DEFAULT_STANCES = {}
    stance_randomisable = False

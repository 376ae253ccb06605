"""Interaction protocols: who speaks when, in which channel, and who is paid what.

``build_protocol_handler(hyper_params)`` returns the handler registered for
``(interaction_protocol, scenario)`` (else ``(interaction_protocol, None)``), wrapped in
:class:`ZeroKnowledgeProtocol` when ``protocol_common.zero_knowledge``. Handlers are
batched torch code over arbitrary leading dims; the step reads a
:class:`ProtocolStepInput` and returns a :class:`ProtocolStepOutput`.

Decisions on the original library's quirks (sections of docs/behaviour.md)
--------------------------------------------------------------------------
* b6 FIXED -- MNIP reads ``mnip_protocol``'s round limits: its own parameter group should
  govern it (the original silently read ``nip_protocol``).
* b5 FIXED -- code-validation MNIP: both provers argue "accept" and both are paid on
  accept, as in generic MNIP; paying prover0 on reject contradicted its prompt.
* b7 FIXED -- ``solo_verifier`` and ``multi_channel_test`` can be stepped in any scenario
  with no prover rewards (the original crashed on a wrong hook signature); solo verifier
  is terminated at once when it does not decide in round 0 (max 2 rounds, min 1).
* b8 FIXED -- ``max_verifier_questions`` of deterministic protocols counts the verifier's
  active rounds in the schedule, so sequential 3-cycle debate/MNIP are right (and
  ``multi_channel_test`` gives 2, not the original's hard-coded 4).
* b3 KEPT -- termination fires at round ``max_message_rounds - 1`` whoever is active: the
  length of an episode is the protocol's, not the verifier's. Consequence: with
  ``verifier_first`` and an even number of rounds the last round belongs to the prover(s),
  so the verifier's last chance to decide is round ``max - 2`` and an undecided episode
  is terminated (penalty) after the prover's last message; use an odd number of rounds to
  give the verifier the last word.
* b4 KEPT -- rewards are computed from the incoming decision even for rows already done
  (pinned by the GI environment golden step; harmless under auto-reset).
* b9 FIXED -- the default Stackelberg follower group is in ``agent_names`` order
  (deterministic), not set order.
* b11 FIXED -- the zero-knowledge step never modifies its inputs (zeroing builds new
  tensors), so the environment's logits are left intact.
* b2 KEPT -- verifier decisions before round ``min_message_rounds - 1`` are ignored (the
  episode goes on), which is what a minimum number of rounds means.
* b10 KEPT -- Merlin-Arthur picks the speaking prover by seed parity (prover1 on even
  seeds): reproducible from the episode seed.

Also kept from the original (docs/behaviour.md#b2): ``protocol_common.force_guess`` only
decides *whether* a decision counts; the rewards use the agent's own decision, so a forced
"continue" (2) is paid as an incorrect guess and pays no prover.
"""

from nip_core.protocols.base import (
    DeterministicSingleVerifierProtocolHandler,
    ProtocolHandler,
    SingleVerifierProtocolHandler,
)
from nip_core.protocols.errors import (
    DuplicateProtocolHandlerError,
    MissingStepInputError,
    ProtocolError,
    ProtocolSpecificationError,
    UnknownAgentError,
    UnknownProtocolError,
    ZeroKnowledgeUnsupportedError,
)
from nip_core.protocols.registry import (
    PROTOCOL_HANDLER_REGISTRY,
    build_protocol_handler,
    get_protocol_handler_class,
    register_protocol_handler,
)
from nip_core.protocols.step import ProtocolStepInput, ProtocolStepOutput

# Importing the protocol modules registers their handlers.
from nip_core.protocols.nip import AdpProtocol, NipProtocol  # noqa: E402  isort: skip
from nip_core.protocols.debate import DebateProtocol, MnipProtocol, TwoProverProtocol  # noqa: E402  isort: skip
from nip_core.protocols.merlin_arthur import MerlinArthurProtocol  # noqa: E402  isort: skip
from nip_core.protocols.solo_verifier import SoloVerifierProtocol  # noqa: E402  isort: skip
from nip_core.protocols.multi_channel_test import MultiChannelTestProtocol  # noqa: E402  isort: skip
from nip_core.protocols.zero_knowledge import ZeroKnowledgeProtocol  # noqa: E402  isort: skip
from nip_core.protocols.code_validation import (  # noqa: E402  isort: skip
    CodeValidationAdpProtocol,
    CodeValidationDebateProtocol,
    CodeValidationMerlinArthurProtocol,
    CodeValidationMnipProtocol,
    CodeValidationNipProtocol,
    CodeValidationProtocolMixin,
    CodeValidationSoloVerifierProtocol,
)

__all__ = [
    "PROTOCOL_HANDLER_REGISTRY",
    "AdpProtocol",
    "CodeValidationAdpProtocol",
    "CodeValidationDebateProtocol",
    "CodeValidationMerlinArthurProtocol",
    "CodeValidationMnipProtocol",
    "CodeValidationNipProtocol",
    "CodeValidationProtocolMixin",
    "CodeValidationSoloVerifierProtocol",
    "DebateProtocol",
    "DeterministicSingleVerifierProtocolHandler",
    "DuplicateProtocolHandlerError",
    "MerlinArthurProtocol",
    "MissingStepInputError",
    "MnipProtocol",
    "MultiChannelTestProtocol",
    "NipProtocol",
    "ProtocolError",
    "ProtocolHandler",
    "ProtocolSpecificationError",
    "ProtocolStepInput",
    "ProtocolStepOutput",
    "SingleVerifierProtocolHandler",
    "SoloVerifierProtocol",
    "TwoProverProtocol",
    "UnknownAgentError",
    "UnknownProtocolError",
    "ZeroKnowledgeProtocol",
    "ZeroKnowledgeUnsupportedError",
    "build_protocol_handler",
    "get_protocol_handler_class",
    "register_protocol_handler",
]

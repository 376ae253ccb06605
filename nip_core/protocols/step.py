"""The tensors a protocol step reads and the tensors it returns.

Every field is batched over the same arbitrary leading shape ``(...)``; fields with an
``agent`` dimension put it right after the batch dims, indexed as
``ProtocolHandler.agent_names``.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass
class ProtocolStepInput:
    """The state an interaction-protocol step is computed from.

    Parameters
    ----------
    round : LongTensor (...)
        Round of the step being taken (0-based).
    seed : LongTensor (...)
        Per-episode seed in ``[0, 2**16)`` (only non-deterministic protocols read it).
    y : LongTensor (...)
        True label, 0 or 1. A trailing singleton dim (``(..., 1)``) is accepted too.
    decision : LongTensor (..., agent)
        0 reject, 1 accept, 2 continue. Only verifiers' decisions are read.
    done : BoolTensor (...)
        Incoming shared done.
    agent_done : BoolTensor (..., agent)
        Incoming per-agent done.
    terminated : BoolTensor (...)
        Incoming terminated flag.
    prover_stance : LongTensor (...), optional
        Per-datapoint stance of the provers (code validation with
        ``protocol_common.randomize_prover_stance`` only).
    message_logits : Tensor (..., agent, channel, position, n_logits), optional
        Message logits of every agent (zero-knowledge only).
    decision_logits : Tensor (..., agent, 3), optional
        Decision logits of every agent (zero-knowledge only).
    """

    round: Tensor
    seed: Tensor
    y: Tensor
    decision: Tensor
    done: Tensor
    agent_done: Tensor
    terminated: Tensor
    prover_stance: Tensor | None = None
    message_logits: Tensor | None = None
    decision_logits: Tensor | None = None

    @property
    def batch_shape(self) -> tuple[int, ...]:
        return tuple(self.round.shape)

    def label(self) -> Tensor:
        """``y`` with shape ``(...)`` (drops a trailing singleton dim if present)."""
        if self.y.dim() == self.round.dim() + 1 and self.y.shape[-1] == 1:
            return self.y.squeeze(-1)
        return self.y

    def restrict_agents(self, num_agents: int) -> "ProtocolStepInput":
        """A shallow copy whose per-agent fields keep only the first ``num_agents`` agents."""
        return ProtocolStepInput(
            round=self.round,
            seed=self.seed,
            y=self.y,
            decision=self.decision[..., :num_agents],
            done=self.done,
            agent_done=self.agent_done[..., :num_agents],
            terminated=self.terminated,
            prover_stance=self.prover_stance,
            message_logits=None if self.message_logits is None
            else self.message_logits[..., :num_agents, :, :, :],
            decision_logits=None if self.decision_logits is None
            else self.decision_logits[..., :num_agents, :],
        )


@dataclass
class ProtocolStepOutput:
    """What a protocol step decides.

    Parameters
    ----------
    shared_done : BoolTensor (...)
        Episode done because the decisive agents have decided (or it was already done).
    agent_done : BoolTensor (..., agent)
    terminated : BoolTensor (...)
        Incoming ``terminated`` or-ed with the termination that happened this step.
    reward : FloatTensor (..., agent)
    """

    shared_done: Tensor
    agent_done: Tensor
    terminated: Tensor
    reward: Tensor

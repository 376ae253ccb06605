"""The joint per-agent action distribution: one message index per (channel, position) + a decision.

Every agent samples a message for every channel/position and a decision every round, active
or not (the protocol ignores what it does not need); the joint log-probability of one
agent is the sum over all its categorical choices (kept, docs/behaviour.md#b23: it
only adds noise of zero mean to the PPO ratio of inactive choices).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.distributions import Categorical


def sample_actions(message_logits: Tensor, decision_logits: Tensor,
                   generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """Sample ``(message (B, A, C, M), decision (B, A))`` from the logits."""
    message = torch.multinomial(torch.softmax(message_logits.reshape(-1, message_logits.shape[-1]), -1),
                                1, generator=generator).reshape(message_logits.shape[:-1])
    decision = torch.multinomial(torch.softmax(decision_logits.reshape(-1, 3), -1), 1,
                                 generator=generator).reshape(decision_logits.shape[:-1])
    return message, decision


def joint_log_prob_and_entropy(message_logits: Tensor, decision_logits: Tensor, message: Tensor,
                               decision: Tensor) -> tuple[Tensor, Tensor]:
    """Per-agent joint log-probability and entropy, each ``(B, A)``.

    Parameters
    ----------
    message_logits : (B, A, C, M, K)
    decision_logits : (B, A, 3)
    message : (B, A, C, M) long
    decision : (B, A) long
    """
    message_dist = Categorical(logits=message_logits, validate_args=False)
    decision_dist = Categorical(logits=decision_logits, validate_args=False)
    log_prob = message_dist.log_prob(message).sum((-1, -2)) + decision_dist.log_prob(decision)
    entropy = message_dist.entropy().sum((-1, -2)) + decision_dist.entropy()
    return log_prob, entropy

"""The decision, termination and reward rules shared by every single-verifier protocol.

Pure tensor functions, batched over arbitrary leading dims ``(...)``; the handlers in
``base.py`` only wire them together. Decision codes: 0 reject, 1 accept, 2 continue.
"""

from __future__ import annotations

import torch
from torch import Tensor

from nip_core.parameters import CommonProtocolParameters

NO_DECISION = 2


def apply_force_guess(decision: Tensor, y: Tensor, force_guess: str | None) -> Tensor:
    """The decision as ``protocol_common.force_guess`` sees it.

    ``"zero"``/``"one"`` replace every decision by 0/1, ``"y"`` by the true label, and
    ``None`` keeps it. Only :func:`decision_made_mask` uses this: rewards are always
    computed from the agent's own decision (as in the original library).
    """
    if force_guess is None:
        return decision
    if force_guess == "zero":
        return torch.zeros_like(decision)
    if force_guess == "one":
        return torch.ones_like(decision)
    if force_guess == "y":
        return torch.broadcast_to(y, decision.shape).to(decision.dtype)
    raise ValueError(f"protocol_common.force_guess: unknown value {force_guess!r}")


def decision_made_mask(
    round_id: Tensor,
    y: Tensor,
    guess_mask: Tensor,
    decision: Tensor,
    *,
    min_message_rounds: int,
    force_guess: str | None,
) -> Tensor:
    """Whether an agent made a decision that counts this step (bool ``(...)``).

    A decision counts when it is the agent's turn to guess, the (force-guessed) decision
    is not "continue", and ``round >= min_message_rounds - 1``; earlier decisions are
    ignored and the episode goes on (kept, docs/behaviour.md#b2).
    """
    decision = apply_force_guess(decision, y, force_guess)
    return guess_mask & (decision != NO_DECISION) & (round_id >= min_message_rounds - 1)


def new_terminated_mask(round_id: Tensor, decision_made: Tensor, *, max_message_rounds: int) -> Tensor:
    """Episodes terminated this step: the last round was reached without a decision.

    Fires at round ``max_message_rounds - 1`` whoever is active in it (kept, docs/behaviour.md#b3).
    """
    return (round_id >= max_message_rounds - 1) & ~decision_made


def verifier_reward(
    *,
    y: Tensor,
    decision: Tensor,
    decision_made: Tensor,
    guess_mask: Tensor,
    shared_done: Tensor,
    terminated: Tensor,
    terminated_now: Tensor,
    common: CommonProtocolParameters,
) -> Tensor:
    """The verifier's reward (float ``(...)``), cases applied in this order.

    1. decision made and equal to ``y``: ``verifier_reward``;
    2. decision made and not equal to ``y``: ``verifier_incorrect_penalty``;
    3. terminated this step: ``verifier_terminated_penalty``;
    4. its turn to guess, not done and not terminated (it chose to continue):
       ``verifier_no_guess_reward``;
    otherwise 0. Rows whose incoming ``done`` was already set still get cases 1-3
    (kept, docs/behaviour.md#b4); ``shared_done``/``terminated`` are the outgoing values.
    """
    reward = torch.zeros(decision.shape, dtype=torch.float32, device=decision.device)
    reward = torch.where(decision_made & (decision == y), common.verifier_reward, reward)
    reward = torch.where(decision_made & (decision != y), common.verifier_incorrect_penalty, reward)
    reward = torch.where(terminated_now, common.verifier_terminated_penalty, reward)
    continued = guess_mask & ~shared_done & ~terminated
    return torch.where(continued, common.verifier_no_guess_reward, reward)


def stance_prover_rewards(
    *, decision: Tensor, decision_made: Tensor, stances: Tensor, prover_reward: float
) -> Tensor:
    """Rewards of the provers (float ``(..., prover)``) when each argues for a stance.

    Prover ``i`` is paid ``prover_reward`` iff the verifier's decision was made and equals
    ``stances[..., i]`` (0 reject, 1 accept). ``stances`` broadcasts against
    ``(..., prover)``.
    """
    paid = decision_made.unsqueeze(-1) & (decision.unsqueeze(-1) == stances)
    return paid.to(torch.float32) * prover_reward


def default_prover_stances(num_provers: int, protocol: str) -> tuple[int, ...]:
    """The stance each prover is paid for by default.

    One prover: accept. Two provers: prover 0 reject, prover 1 accept. More provers need
    a protocol-specific rule.
    """
    if num_provers == 1:
        return (1,)
    if num_provers == 2:
        return (0, 1)
    raise NotImplementedError(
        f"protocol {protocol}: the default prover reward supports one or two provers, got "
        f"{num_provers}; override _include_prover_rewards"
    )

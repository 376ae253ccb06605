"""Interaction-protocol parameter groups."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from nip_core.parameters.base import ParamsModel


class CommonProtocolParameters(ParamsModel):
    verifier_first: bool = True
    randomize_prover_stance: bool = False
    prover_reward: float = 1.0
    verifier_reward: float = 1.0
    verifier_incorrect_penalty: float = -1.0
    verifier_terminated_penalty: float = -1.0
    verifier_no_guess_reward: float = 0.0
    shared_reward: bool = False
    force_guess: Literal["zero", "one", "y"] | None = None
    zero_knowledge: bool = False


class _RoundLimits(ParamsModel):
    max_message_rounds: int = Field(8, ge=1)
    min_message_rounds: int = Field(1, ge=0)

    @model_validator(mode="after")
    def _check_rounds(self):
        if self.min_message_rounds > self.max_message_rounds:
            raise ValueError("min_message_rounds must be <= max_message_rounds")
        return self


class NipProtocolParameters(_RoundLimits):
    pass


class DebateProtocolParameters(_RoundLimits):
    sequential: bool = False
    prover0_first: bool = True
    randomize_channel_order: bool = True


class MnipProtocolParameters(_RoundLimits):
    """MNIP settings. Unlike the original (QUIRK 1), MNIP reads its own round limits."""

    sequential: bool = False
    prover0_first: bool = True
    randomize_channel_order: bool = True


class ZkProtocolParameters(ParamsModel):
    simulator_reward_coefficient: float = 1.0
    aux_prover_reward_coefficient: float = 1.0

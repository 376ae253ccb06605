"""Interaction-protocol parameter groups."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from nip_core.parameters.base import ParamsModel


class CommonProtocolParameters(ParamsModel):
    verifier_first: bool = Field(True, description="The verifier speaks in the first round (then every "
                                                   "other round); False: the prover(s) open.")
    randomize_prover_stance: bool = Field(False, description="Code validation: draw each prover's stance "
                                                             "(argue accept or reject) at random per "
                                                             "episode instead of the protocol's default "
                                                             "stances.")
    prover_reward: float = Field(1.0, description="Reward of each prover when the verifier's decision "
                                                  "equals the prover's stance (without shared_reward).")
    verifier_reward: float = Field(1.0, description="Reward of the verifier for a correct decision.")
    verifier_incorrect_penalty: float = Field(
        -1.0, description="Reward (usually negative) of the verifier for an incorrect decision.")
    verifier_terminated_penalty: float = Field(
        -1.0, description="Reward (usually negative) of the verifier when the episode reaches "
                          "max_message_rounds without a decision.")
    verifier_no_guess_reward: float = Field(0.0, description="Reward of the verifier in each round in which "
                                                             "it continues instead of deciding.")
    shared_reward: bool = Field(False, description="Every prover gets the verifier's reward (a cooperative "
                                                   "game) instead of its own.")
    force_guess: Literal["zero", "one", "y"] | None = Field(
        None, description="Replace the verifier's decision by a constant ('zero': reject, 'one': accept) or "
                          "the true label ('y'); None: the verifier decides.")
    zero_knowledge: bool = Field(False, description="Wrap the protocol in the zero-knowledge variant (adds "
                                                    "a simulator and an adversarial verifier; graph "
                                                    "isomorphism only).")


class _RoundLimits(ParamsModel):
    max_message_rounds: int = Field(8, ge=1, description="Rounds after which an episode ends without a "
                                                         "decision (>= 1).")
    min_message_rounds: int = Field(1, ge=0, description="Rounds before which the verifier cannot decide (0 "
                                                         "to max_message_rounds).")

    @model_validator(mode="after")
    def _check_rounds(self):
        if self.min_message_rounds > self.max_message_rounds:
            raise ValueError("min_message_rounds must be <= max_message_rounds")
        return self


class NipProtocolParameters(_RoundLimits):
    pass


class DebateProtocolParameters(_RoundLimits):
    sequential: bool = Field(False, description="The two provers speak in separate rounds, one after the "
                                                "other; False: both in the same round.")
    prover0_first: bool = Field(True, description="With sequential: prover0 speaks before prover1 (False: "
                                                  "prover1 first).")
    randomize_channel_order: bool = Field(True, description="Code validation: show the verifier the "
                                                            "provers' channels in a random order per "
                                                            "episode (not read for graph isomorphism).")


class MnipProtocolParameters(_RoundLimits):
    """MNIP settings. Unlike the original (docs/behaviour.md#b6), MNIP reads its own round limits."""

    sequential: bool = Field(False, description="The two provers speak in separate rounds, one after the "
                                                "other; False: both in the same round.")
    prover0_first: bool = Field(True, description="With sequential: prover0 speaks before prover1 (False: "
                                                  "prover1 first).")
    randomize_channel_order: bool = Field(True, description="Code validation: show the verifier the "
                                                            "provers' channels in a random order per "
                                                            "episode (not read for graph isomorphism).")


class ZkProtocolParameters(ParamsModel):
    simulator_reward_coefficient: float = Field(
        1.0, description="Scale of the simulator's reward: the cosine similarity of its messages and "
                         "decisions to the adversarial verifier's (which gets the negative).")
    aux_prover_reward_coefficient: float = Field(
        1.0, description="Weight with which the simulator's reward is added to each prover's reward "
                         "(zero-knowledge protocols).")

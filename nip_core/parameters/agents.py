"""Per-agent parameters: learning-rate factors, update schedules, and scenario agent blocks.

``HyperParameters.agents`` maps agent names to one of the agent-parameter classes here.
The special key ``"_default"`` supplies the parameters of any agent not listed. The
``kind`` field is the discriminator; it is filled in from the scenario (or from
``is_random: true``) when a user leaves it out.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import Field, model_validator

from nip_core.parameters.base import ParamsModel

ActivationFunction = Literal["relu", "tanh", "sigmoid"]


class LrFactors(ParamsModel):
    """Multipliers of a learning rate for the actor and the critic parts."""

    actor: float = Field(1.0, ge=0.0)
    critic: float = Field(1.0, ge=0.0)


# --- update schedules ------------------------------------------------------------------


class ConstantUpdateSchedule(ParamsModel):
    """The agent is updated every iteration."""

    kind: Literal["constant"] = "constant"

    def is_active(self, iteration: int) -> bool:
        return True


class ContiguousPeriodicUpdateSchedule(ParamsModel):
    """Update iff ``start <= iteration mod period < stop``."""

    kind: Literal["contiguous_periodic"] = "contiguous_periodic"
    period: int = Field(..., gt=0)
    start: int = Field(0, ge=0)
    stop: int

    @model_validator(mode="after")
    def _check_window(self) -> "ContiguousPeriodicUpdateSchedule":
        if not 0 <= self.start <= self.stop <= self.period:
            raise ValueError("need 0 <= start <= stop <= period")
        return self

    def is_active(self, iteration: int) -> bool:
        return self.start <= iteration % self.period < self.stop


class AlternatingPeriodicUpdateSchedule(ParamsModel):
    """Two agents alternate: the first for ``first_agent_num_rounds`` iterations of each period."""

    kind: Literal["alternating_periodic"] = "alternating_periodic"
    period: int = Field(..., gt=0)
    first_agent_num_rounds: int = Field(..., ge=0)
    first_agent: bool = True

    @model_validator(mode="after")
    def _check_rounds(self) -> "AlternatingPeriodicUpdateSchedule":
        if self.first_agent_num_rounds > self.period:
            raise ValueError("first_agent_num_rounds must be <= period")
        return self

    def is_active(self, iteration: int) -> bool:
        in_first = iteration % self.period < self.first_agent_num_rounds
        return in_first if self.first_agent else not in_first


UpdateSchedule = Annotated[
    Union[ConstantUpdateSchedule, ContiguousPeriodicUpdateSchedule, AlternatingPeriodicUpdateSchedule],
    Field(discriminator="kind"),
]


# --- agents ----------------------------------------------------------------------------


class AgentParameters(ParamsModel):
    """Parameters common to every agent."""

    agent_lr_factor: LrFactors = Field(default_factory=LrFactors)
    body_lr_factor: LrFactors = Field(default_factory=LrFactors)
    update_schedule: UpdateSchedule = Field(default_factory=ConstantUpdateSchedule)
    use_manual_architecture: bool = False
    normalize_message_history: bool = False
    load_checkpoint_and_parameters: bool = False
    checkpoint_run_id: str | None = None
    checkpoint_version: str = "latest"
    use_orthogonal_initialisation: bool = True
    orthogonal_initialisation_gain: float = 1.0

    @property
    def is_random(self) -> bool:
        return False


class RandomAgentParameters(AgentParameters):
    """An agent that acts uniformly at random and is never trained."""

    kind: Literal["random"] = "random"

    @property
    def is_random(self) -> bool:
        return True


class GraphIsomorphismAgentParameters(AgentParameters):
    """Architecture of a graph-isomorphism agent (GNN body, transformer, heads)."""

    kind: Literal["graph_isomorphism"] = "graph_isomorphism"
    activation_function: ActivationFunction = "tanh"
    num_gnn_layers: int = Field(5, ge=0)
    d_gnn: int = Field(16, gt=0)
    d_gin_mlp: int = Field(64, gt=0)
    gnn_output_digits: int | None = None
    use_dual_gnn: bool = True
    num_heads: int = Field(4, gt=0)
    num_transformer_layers: int = Field(4, ge=0)
    d_transformer: int = Field(16, gt=0)
    d_transformer_mlp: int = Field(64, gt=0)
    transformer_dropout: float = Field(0.0, ge=0.0, lt=1.0)
    d_node_selector: int = Field(16, gt=0)
    num_node_selector_layers: int = Field(2, ge=1)
    d_decider: int = Field(16, gt=0)
    num_decider_layers: int = Field(2, ge=1)
    include_round_in_decider: bool = True
    d_linear_message_selector: int = Field(16, gt=0)
    num_linear_message_selector_layers: int = Field(2, ge=1)
    d_value: int = Field(16, gt=0)
    num_value_layers: int = Field(2, ge=1)
    include_round_in_value: bool = True
    use_batch_norm: bool = True
    noise_sigma: float = Field(0.0, ge=0.0)
    use_pair_invariant_pooling: bool = True
    gnn_lr_factor: LrFactors = Field(default_factory=LrFactors)

    @model_validator(mode="after")
    def _check_heads(self) -> "GraphIsomorphismAgentParameters":
        if self.num_transformer_layers > 0 and self.d_transformer % self.num_heads != 0:
            raise ValueError("d_transformer must be divisible by num_heads")
        return self

    @classmethod
    def construct_test_params(cls) -> "GraphIsomorphismAgentParameters":
        """Tiny widths and depths, for fast smoke tests."""
        return cls(num_gnn_layers=1, d_gnn=2, d_gin_mlp=2, num_heads=2, num_transformer_layers=1,
                   d_transformer=2, d_transformer_mlp=2, d_node_selector=2, num_node_selector_layers=1,
                   d_decider=2, num_decider_layers=1, d_linear_message_selector=2,
                   num_linear_message_selector_layers=1, d_value=2, num_value_layers=1)


class CodeValidationAgentParameters(AgentParameters):
    """A text agent behind an OpenAI-compatible chat API."""

    kind: Literal["code_validation"] = "code_validation"
    model_provider: Literal["OpenAI"] = "OpenAI"
    model_name: str = "gpt-4o-mini-2024-07-18"
    use_dummy_api: bool = False
    shared_model_group: str | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    fine_tune_from_scratch: bool = True
    freeze_agent: bool = False
    max_response_words: int = Field(150, gt=0)
    max_tokens_per_message: int | None = Field(None, gt=0)
    num_invalid_generation_retries: int = Field(20, ge=0)

    @classmethod
    def construct_test_params(cls) -> "CodeValidationAgentParameters":
        return cls(use_dummy_api=True)


AnyAgentParameters = Annotated[
    Union[GraphIsomorphismAgentParameters, CodeValidationAgentParameters, RandomAgentParameters],
    Field(discriminator="kind"),
]

AGENT_PARAMS_BY_SCENARIO: dict[str, type[AgentParameters]] = {
    "graph_isomorphism": GraphIsomorphismAgentParameters,
    "code_validation": CodeValidationAgentParameters,
}

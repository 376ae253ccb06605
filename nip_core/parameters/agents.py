"""Per-agent parameters: learning-rate factors, update schedules, and scenario agent blocks.

``HyperParameters.agents`` maps agent names to one of the agent-parameter classes here.
The special key ``"_default"`` supplies the parameters of any agent not listed. The
``kind`` field is the discriminator; it is filled in from the scenario (or from
``is_random: true``) when a user leaves it out.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import Field, model_validator

from nip_core.parameters.base import ParamsModel, unsupported_field

ActivationFunction = Literal["relu", "tanh", "sigmoid"]


class LrFactors(ParamsModel):
    """Multipliers of a learning rate for the actor and the critic parts."""

    actor: float = Field(1.0, ge=0.0, description="Multiplier (>= 0) of the learning rate of the actor "
                                                  "(policy) parameters; 0 freezes them.")
    critic: float = Field(1.0, ge=0.0, description="Multiplier (>= 0) of the learning rate of the critic "
                                                   "(value) parameters; 0 freezes them.")


# --- update schedules ------------------------------------------------------------------


class ConstantUpdateSchedule(ParamsModel):
    """The agent is updated every iteration."""

    kind: Literal["constant"] = Field("constant", description="Schedule type: 'constant' updates the agent "
                                                              "in every iteration.")

    def is_active(self, iteration: int) -> bool:
        return True


class ContiguousPeriodicUpdateSchedule(ParamsModel):
    """Update iff ``start <= iteration mod period < stop``."""

    kind: Literal["contiguous_periodic"] = Field(
        "contiguous_periodic", description="Schedule type: 'contiguous_periodic' updates the agent in one "
                                           "window of each period.")
    period: int = Field(..., gt=0, description="Length of the cycle, in iterations (> 0).")
    start: int = Field(0, ge=0, description="First iteration of the update window in each cycle (iteration "
                                            "modulo period).")
    stop: int = Field(..., description="End of the update window in each cycle, exclusive; 0 <= start <= "
                                       "stop <= period.")

    @model_validator(mode="after")
    def _check_window(self) -> "ContiguousPeriodicUpdateSchedule":
        if not 0 <= self.start <= self.stop <= self.period:
            raise ValueError("need 0 <= start <= stop <= period")
        return self

    def is_active(self, iteration: int) -> bool:
        return self.start <= iteration % self.period < self.stop


class AlternatingPeriodicUpdateSchedule(ParamsModel):
    """Two agents alternate: the first for ``first_agent_num_rounds`` iterations of each period."""

    kind: Literal["alternating_periodic"] = Field(
        "alternating_periodic", description="Schedule type: 'alternating_periodic' alternates updates "
                                            "between two agents.")
    period: int = Field(..., gt=0, description="Length of the cycle shared by the two agents, in iterations "
                                               "(> 0).")
    first_agent_num_rounds: int = Field(
        ..., ge=0, description="Iterations at the start of each cycle in which the first agent is updated "
                               "(0 to period); the second agent is updated in the rest.")
    first_agent: bool = Field(True, description="True: this agent is updated at the start of each cycle; "
                                                "False: in the rest of it.")

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

_WARM_START_INSTEAD = ("per-agent checkpoint loading is not implemented; start a run from another run's final "
                       "models with a warm start (warm_start_from) instead.")
_NO_LINEAR_MESSAGES = "messages are nodes only; the linear message space is not implemented."


class AgentParameters(ParamsModel):
    """Parameters common to every agent."""

    agent_lr_factor: LrFactors = Field(
        default_factory=LrFactors, description="Multipliers (actor, critic) of the trainer's learning rate "
                                               "for all of this agent's parameters (TensorDict trainers).")
    body_lr_factor: LrFactors = Field(
        default_factory=LrFactors, description="Further multipliers (actor, critic) of the learning rate of "
                                               "the agent's body, on top of agent_lr_factor (ignored by "
                                               "solo_agent.body_lr_factor_override).")
    update_schedule: UpdateSchedule = Field(
        default_factory=ConstantUpdateSchedule, description="In which iterations a TensorDict trainer "
                                                            "updates this agent (constant: every one); in "
                                                            "the others its parameters stay as they are.")
    use_manual_architecture: bool = unsupported_field(
        False, "Use a hand-written agent instead of the learned one.",
        "nipflow builds learned agents only (or random ones: is_random).")
    normalize_message_history: bool = unsupported_field(
        False, "Normalise the message history fed to the agent.",
        "the agents read the message history as it is; rl.normalize_observations normalises observations.")
    load_checkpoint_and_parameters: bool = unsupported_field(
        False, "Load the agent's weights and parameters from a checkpoint of another run.",
        _WARM_START_INSTEAD)
    checkpoint_run_id: str | None = unsupported_field(
        None, "Run to load the agent's checkpoint from (with load_checkpoint_and_parameters).",
        _WARM_START_INSTEAD)
    checkpoint_version: str = unsupported_field(
        "latest", "Checkpoint version to load ('latest' or a version tag).", _WARM_START_INSTEAD)
    use_orthogonal_initialisation: bool = Field(
        True, description="Initialise the agent's linear layers orthogonally (graph-isomorphism agents); "
                          "False keeps PyTorch's default initialisation.")
    orthogonal_initialisation_gain: float = Field(
        1.0, description="Gain of the orthogonal initialisation (with use_orthogonal_initialisation).")

    @property
    def is_random(self) -> bool:
        return False

    @property
    def is_scripted(self) -> bool:
        """The agent acts by a fixed rule (random, or an oracle): no learned parts, never trained."""
        return False


class RandomAgentParameters(AgentParameters):
    """An agent that acts uniformly at random and is never trained."""

    kind: Literal["random"] = Field("random", description="Agent type: 'random' acts uniformly at random "
                                                          "and is never trained (is_random: true sets it).")

    @property
    def is_random(self) -> bool:
        return True

    @property
    def is_scripted(self) -> bool:
        return True


class OracleProverParameters(AgentParameters):
    """A graph-isomorphism prover that knows the answer and always helps; never trained.

    A diagnostic of the protocol and the verifier: after the verifier's node ``v``, it answers
    in the other graph with a node of ``v``'s colour-refinement (Weisfeiler-Lehman) colour when
    the graphs are isomorphic, and with a node of another colour when they are not (uniformly
    among such nodes; among all nodes of that graph when there is none). A verifier trained
    against it shows what the message path can carry (docs/behaviour.md#b45).
    """

    kind: Literal["oracle_prover"] = Field(
        "oracle_prover", description="Agent type: 'oracle_prover', a graph-isomorphism prover that knows the "
                                     "label and points at a node of the verifier's node's WL colour (isomorphic) "
                                     "or of another colour (not isomorphic); never trained.")

    @property
    def is_scripted(self) -> bool:
        return True


class GraphIsomorphismAgentParameters(AgentParameters):
    """Architecture of a graph-isomorphism agent (GNN body, transformer, heads)."""

    kind: Literal["graph_isomorphism"] = Field(
        "graph_isomorphism", description="Agent type: 'graph_isomorphism' (filled in from the scenario when "
                                         "left out).")
    activation_function: ActivationFunction = Field(
        "tanh", description="Non-linearity of the GNN layers and of the node-selector, decider and value "
                            "head MLPs.")
    num_gnn_layers: int = Field(5, ge=0, description="GIN message-passing layers of the graph body (0: node "
                                                     "features only).")
    d_gnn: int = Field(16, gt=0, description="Width of the GNN's node representations.")
    d_gin_mlp: int = Field(64, gt=0, description="Hidden width of the MLP inside each GIN layer.")
    gnn_output_digits: int | None = Field(None, description="Round the GNN's outputs to this many decimal "
                                                            "digits (None: no rounding).")
    use_dual_gnn: bool = Field(True, description="Also run the GNN on all-zero node features and "
                                                 "concatenate both outputs (node width 2 x d_gnn).")
    num_heads: int = Field(4, gt=0, description="Attention heads of the transformer; d_transformer must be "
                                                "divisible by it.")
    num_transformer_layers: int = Field(4, ge=0, description="Transformer layers over the graph and node "
                                                             "tokens (0: none).")
    d_transformer: int = Field(16, gt=0, description="Width of the transformer's tokens.")
    d_transformer_mlp: int = Field(64, gt=0, description="Hidden width of the transformer's feed-forward "
                                                         "layers.")
    transformer_dropout: float = Field(
        0.0, ge=0.0, lt=1.0, description="Dropout probability in the transformer, in [0, 1).")
    d_node_selector: int = Field(16, gt=0, description="Hidden width of the node-selector head (which node "
                                                       "the agent sends as its message).")
    num_node_selector_layers: int = Field(
        2, ge=1, description="Linear layers of the node-selector head MLP (>= 1; 1 builds two, as 2 does, as "
                             "in the original: docs/behaviour.md#b44).")
    d_decider: int = Field(16, gt=0, description="Hidden width of the decider head (reject, accept or "
                                                 "continue).")
    num_decider_layers: int = Field(
        2, ge=1, description="Linear layers of the decider head MLP (>= 1; 1 builds two, as 2 does, as "
                             "in the original: docs/behaviour.md#b44).")
    include_round_in_decider: bool = Field(True, description="Give the decider head the current round "
                                                             "number as an input.")
    d_linear_message_selector: int = unsupported_field(
        16, "Hidden width of the linear-message selector head.", _NO_LINEAR_MESSAGES, gt=0)
    num_linear_message_selector_layers: int = unsupported_field(
        2, "Layers of the linear-message selector head.", _NO_LINEAR_MESSAGES, ge=1)
    d_value: int = Field(16, gt=0, description="Hidden width of the value (critic) head.")
    num_value_layers: int = Field(
        2, ge=1, description="Linear layers of the value head MLP (>= 1; 1 builds two, as 2 does, as "
                             "in the original: docs/behaviour.md#b44).")
    include_round_in_value: bool = Field(True, description="Give the value head the current round number as "
                                                           "an input.")
    use_batch_norm: bool = Field(True, description="Batch-normalise the pooled graph representations (batch "
                                                   "statistics only).")
    noise_sigma: float = Field(0.0, ge=0.0, description="Training only: standard deviation of "
                                                        "multiplicative Gaussian noise on the pooled graph "
                                                        "representations (0: none).")
    use_pair_invariant_pooling: bool = Field(
        True, description="Replace the two graphs' pooled representations by their mean and half their "
                          "absolute difference (invariant to the order of the pair).")
    gnn_lr_factor: LrFactors = Field(
        default_factory=LrFactors, description="Further multipliers (actor, critic) of the learning rate of "
                                               "the GNN part of the body.")

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
                   d_decider=2, num_decider_layers=1, d_value=2, num_value_layers=1)


class CodeValidationAgentParameters(AgentParameters):
    """A text agent behind an OpenAI-compatible chat API."""

    kind: Literal["code_validation"] = Field(
        "code_validation", description="Agent type: 'code_validation' (filled in from the scenario when "
                                       "left out).")
    model_provider: Literal["OpenAI"] = Field(
        "OpenAI", description="Provider of the chat model: 'OpenAI', an OpenAI-compatible chat and fine-tuning "
                              "API, the only one (any other value is refused); the run settings choose its "
                              "server (openai_base_url, or the local API server).")
    model_name: str = Field(
        "gpt-4o-mini-2024-07-18", description="Chat model the agent samples from, and the base model of its "
                                              "fine-tune jobs.")
    use_dummy_api: bool = unsupported_field(
        False, "Use a dummy API instead of a real model.",
        "the run settings choose the API server (openai_base_url, or the local API server for tests).")
    shared_model_group: str | None = Field(None, description="Agents with the same group share one model "
                                                             "and one fine-tune job per iteration (None: a "
                                                             "group of its own).")
    temperature: float | None = Field(
        None, ge=0.0, le=2.0, description="Sampling temperature sent to the API, 0 to 2 (None: the API's "
                                          "default).")
    top_p: float | None = Field(
        None, gt=0.0, le=1.0, description="Nucleus-sampling probability mass sent to the API, in (0, 1] "
                                          "(None: the API's default).")
    fine_tune_from_scratch: bool = Field(True, description="Fine-tune every iteration from model_name "
                                                           "(True) or from the agent's latest fine-tuned "
                                                           "model (False).")
    freeze_agent: bool = Field(False, description="Never fine-tune this agent: it answers with model_name "
                                                  "throughout.")
    max_response_words: int = Field(150, gt=0, description="Word limit the prompt asks for; also max_tokens "
                                                           "= 1.5 x this when max_tokens_per_message is "
                                                           "None.")
    max_tokens_per_message: int | None = Field(
        None, gt=0, description="max_tokens of each API request (None: 1.5 x max_response_words).")
    num_invalid_generation_retries: int = Field(
        20, ge=0, description="Re-samples of a reply that cannot be parsed; after that the agent sends "
                              "nothing in that round.")
    decision_constraint: Literal["auto", "on", "off"] = Field(
        "auto", description="A verifier's replies: 'on' asks the API for structured output holding "
                            "the reply in the round where it must decide to 'Decision: accept' or 'Decision: "
                            "reject' (vLLM's guided_choice), and its replies in the other rounds to a "
                            "decision (not before round min_message_rounds - 1, where the protocol would "
                            "ignore it) or its 'Question for <Name>: ...' lines (guided_regex); nipflow's "
                            "transformers and vLLM engines enforce both. 'off' samples them freely, 'auto' is 'on' where the server lists the model with "
                            "the structured_output capability (not OpenAI, whose models write the line "
                            "unaided). Provers never decide: 'on' is refused for them.")

    @classmethod
    def construct_test_params(cls) -> "CodeValidationAgentParameters":
        """The defaults: the run settings, not the parameters, point tests at a local API server."""
        return cls()


AnyAgentParameters = Annotated[
    Union[GraphIsomorphismAgentParameters, CodeValidationAgentParameters, RandomAgentParameters,
          OracleProverParameters],
    Field(discriminator="kind"),
]

AGENT_PARAMS_BY_SCENARIO: dict[str, type[AgentParameters]] = {
    "graph_isomorphism": GraphIsomorphismAgentParameters,
    "code_validation": CodeValidationAgentParameters,
}

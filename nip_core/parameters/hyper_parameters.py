"""``HyperParameters``: the complete, hashable specification of an experiment.

Anything that can change a result lives here; run-time options that cannot (device,
logging, where files go) live in ``ExperimentSettings``.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, ValidationError, ValidationInfo, model_validator

from nip_core.parameters.agents import (
    AGENT_PARAMS_BY_SCENARIO,
    AgentParameters,
    AnyAgentParameters,
    OracleProverParameters,
)
from nip_core.parameters.base import (
    FieldProblems,
    ParameterError,
    ParamsModel,
    problems_from_validation_error,
    unsupported_field,
)
from nip_core.parameters.field_use import unread_fields
from nip_core.parameters.protocols import (
    CommonProtocolParameters,
    DebateProtocolParameters,
    MnipProtocolParameters,
    NipProtocolParameters,
    ZkProtocolParameters,
)
from nip_core.parameters.scenario import (
    CodeValidationParameters,
    DatasetParameters,
    MessageRegressionParameters,
)
from nip_core.parameters.trainer_specs import generation as trainer_specs_generation
from nip_core.parameters.trainer_specs import is_text_trainer, registered_trainer_names, unknown_trainer_message
from nip_core.parameters.trainers import (
    BaseRunParameters,
    CommonPpoParameters,
    PureTextEiParameters,
    PureTextMaltParameters,
    ReinforceParameters,
    RlTrainerParameters,
    SoloAgentParameters,
    SpgParameters,
    TextRlParameters,
    VanillaPpoParameters,
)

ScenarioType = Literal["graph_isomorphism", "code_validation"]


def _check_trainer_name(name: str) -> str:
    """Accept a registered trainer name only (the built-in trainers are imported on first use)."""
    if name not in registered_trainer_names():
        raise ValueError(unknown_trainer_message(name))
    return name


def _trainer_names_schema(schema: dict[str, Any]) -> None:
    schema["enum"] = registered_trainer_names()


#: The name of a trainer registered with ``@register_trainer`` (``nip_core.trainers.registry``, declared in ``trainer_specs``);
#: checked against the registry when validated, listed as an enum in the JSON schema.
TrainerType = Annotated[str, AfterValidator(_check_trainer_name),
                        Field(json_schema_extra=_trainer_names_schema)]

InteractionProtocolType = Literal[
    "nip", "adp", "debate", "merlin_arthur", "mnip", "solo_verifier", "multi_channel_test"
]

DEFAULT_AGENT_KEY = "_default"

_NO_LINEAR_MESSAGES = "graph-isomorphism messages are nodes only; the linear message space is not implemented."

#: Fields added after runs had been stored, oldest first, each with the value every run stored
#: before it had in effect. Older code hashed trees without them, so a stored checkpoint of an
#: older run carries the hash of the tree without the fields added since (at those values):
#: :meth:`HyperParameters.accepted_params_hashes`. Append a field here when it is added.
FIELDS_ADDED_SINCE_STORED_RUNS: tuple[tuple[str, Any], ...] = (
    ("text_rl.fine_tune_n_epochs", "auto"),
)


class HyperParameters(ParamsModel):
    """All the parameters of an experiment, as a nested pydantic model.

    ``HyperParameters.model_validate(hp.to_dict()) == hp`` holds exactly, and
    :meth:`params_hash` is stable across processes and machines.
    """

    scenario: ScenarioType = Field(..., description="The task: graph_isomorphism (are two graphs "
                                                    "isomorphic?) or code_validation (is a solution to a "
                                                    "coding problem correct?).")
    trainer: TrainerType = Field(..., description="Registered trainer that trains the agents; TensorDict "
                                                  "and solo trainers take graph_isomorphism, text trainers "
                                                  "(pure_text_*) code_validation.")
    dataset: str = Field(..., description="Dataset name of the scenario (graph_isomorphism: a named or "
                                          "cached dataset; code_validation: a registered dataset).")
    interaction_protocol: InteractionProtocolType = Field(
        "nip", description="Interaction protocol: which agents exchange messages, in which order, and how "
                           "they are paid.")
    seed: int = Field(6198, ge=0, lt=2**63, description="Random seed of the experiment: agent "
                                                        "initialisation, environments, data order and "
                                                        "sampling (0 to 2^63 - 1).")
    functionalize_modules: bool = unsupported_field(
        False, "Build the agents as functional modules (TorchRL's functional losses).",
        "the losses are TorchRL LossModules over the agents' ordinary modules; there is no functional mode.")
    pretrain_agents: bool = Field(False, description="TensorDict RL trainers first train each agent's body "
                                                     "with a solo (supervised) head on the dataset labels "
                                                     "(solo_agent.* settings), once, before iteration 0; RL "
                                                     "starts from the pretrained bodies.")
    test_size: float = Field(0.2, gt=0.0, lt=1.0, description="solo_agent and pretrain_agents: fraction "
                                                              "(0 to 1) of the training data held out to test "
                                                              "the supervised training.")
    d_representation: int = Field(16, gt=0, description="Graph isomorphism: width of the representation the "
                                                        "agents' bodies hand to the heads.")
    message_size: int = Field(1, gt=0, description="Graph isomorphism: nodes sent per message.")
    include_linear_message_space: bool = unsupported_field(
        False, "Add a linear message space to the node messages.", _NO_LINEAR_MESSAGES)
    d_linear_message_space: int = unsupported_field(
        2, "Size of the linear message space.", _NO_LINEAR_MESSAGES, gt=0)
    agents: dict[str, AnyAgentParameters] = Field(
        default_factory=dict, description="Per-agent parameters by agent name (prover, verifier, prover0 "
                                          "...); '_default' applies to every agent not listed.")
    rl: RlTrainerParameters = Field(
        default_factory=RlTrainerParameters, description="Settings common to the RL and text trainers "
                                                         "(batch sizes, iterations, optimiser, test loop).")
    ppo: CommonPpoParameters = Field(
        default_factory=CommonPpoParameters, description="PPO loss settings (vanilla_ppo; the critic and "
                                                         "entropy weights also spg).")
    vanilla_ppo: VanillaPpoParameters = Field(
        default_factory=VanillaPpoParameters, description="Settings of the vanilla_ppo trainer (none of its "
                                                          "own).")
    spg: SpgParameters = Field(
        default_factory=SpgParameters, description="Settings of the spg trainer (Stackelberg and "
                                                   "opponent-shaping policy gradients).")
    reinforce: ReinforceParameters = Field(
        default_factory=ReinforceParameters, description="Settings of the reinforce trainer.")
    solo_agent: SoloAgentParameters = Field(
        default_factory=SoloAgentParameters, description="Settings of the solo_agent trainer (supervised "
                                                         "training of each agent alone).")
    text_rl: TextRlParameters = Field(
        default_factory=TextRlParameters, description="Settings common to the text trainers (fine-tuning, "
                                                      "transcripts, tests).")
    pure_text_ei: PureTextEiParameters = Field(
        default_factory=PureTextEiParameters, description="Settings of the pure_text_ei trainer (expert "
                                                          "iteration: rollout selection).")
    pure_text_malt: PureTextMaltParameters = Field(
        default_factory=PureTextMaltParameters, description="Settings of the pure_text_malt trainer "
                                                            "(multi-agent rollout trees).")
    code_validation: CodeValidationParameters = Field(
        default_factory=CodeValidationParameters, description="Code-validation scenario settings (APPS "
                                                              "problem selection).")
    dataset_options: DatasetParameters = Field(
        default_factory=DatasetParameters, description="Options applied when the dataset is loaded (size "
                                                       "limits).")
    protocol_common: CommonProtocolParameters = Field(
        default_factory=CommonProtocolParameters, description="Settings of every interaction protocol (turn "
                                                              "order, rewards, forced guesses, zero "
                                                              "knowledge).")
    nip_protocol: NipProtocolParameters = Field(
        default_factory=NipProtocolParameters, description="Round limits of the nip and adp protocols "
                                                           "(merlin_arthur and solo_verifier have fixed "
                                                           "ones).")
    debate_protocol: DebateProtocolParameters = Field(
        default_factory=DebateProtocolParameters, description="Round limits and speaking order of the "
                                                              "debate protocol.")
    mnip_protocol: MnipProtocolParameters = Field(
        default_factory=MnipProtocolParameters, description="Round limits and speaking order of the mnip "
                                                            "protocol.")
    zk_protocol: ZkProtocolParameters = Field(
        default_factory=ZkProtocolParameters, description="Reward weights of the zero-knowledge variants "
                                                          "(protocol_common.zero_knowledge).")
    message_regression: MessageRegressionParameters = Field(default_factory=MessageRegressionParameters,
        description="Regression of the labels from the agents' messages (original library). Not supported by "
                    "nipflow: every field is accepted at its default only.")
    base_run: BaseRunParameters = Field(
        default_factory=BaseRunParameters, description="Start from another run's parameters, or re-test its "
                                                       "models.")

    # -- normalisation -----------------------------------------------------------------

    @model_validator(mode="before")
    @classmethod
    def _fill_agent_kinds(cls, data: Any) -> Any:
        """Give each agent dict its ``kind`` from the scenario (or ``is_random``)."""
        if not isinstance(data, dict):
            return data
        agents = data.get("agents")
        scenario = data.get("scenario")
        if agents is None:
            data = {**data, "agents": {}}
            return data
        if not isinstance(agents, dict) or scenario not in AGENT_PARAMS_BY_SCENARIO:
            return data
        filled: dict[str, Any] = {}
        for name, value in agents.items():
            if isinstance(value, dict) and "kind" not in value:
                value = dict(value)
                value["kind"] = "random" if value.pop("is_random", False) else scenario
            elif isinstance(value, dict) and "is_random" in value:
                value = {k: v for k, v in value.items() if k != "is_random"}
            filled[name] = value
        return {**data, "agents": filled}

    @model_validator(mode="after")
    def _check_consistency(self, info: ValidationInfo) -> "HyperParameters":
        expected = AGENT_PARAMS_BY_SCENARIO[self.scenario]
        if DEFAULT_AGENT_KEY not in self.agents:
            # Assigning through __dict__ avoids re-running validation on a partial model.
            self.__dict__["agents"] = {DEFAULT_AGENT_KEY: expected(), **self.agents}
        for name, agent in self.agents.items():
            if isinstance(agent, OracleProverParameters):
                if self.scenario != "graph_isomorphism" or "prover" not in name:
                    raise ValueError(f"agents.{name}: an oracle_prover is a graph-isomorphism prover; "
                                     f"'{name}' of scenario '{self.scenario}' cannot be one")
            elif not agent.is_random and not isinstance(agent, expected):
                raise ValueError(
                    f"agents.{name}: parameters of kind '{getattr(agent, 'kind', '?')}' "
                    f"do not fit scenario '{self.scenario}'"
                )
            if (getattr(agent, "decision_constraint", None) == "on" and name != DEFAULT_AGENT_KEY
                    and "verifier" not in name):
                raise ValueError(f"agents.{name}.decision_constraint: 'on' holds a verifier's decision to its "
                                 f"form; {name} is a prover and never decides")
        text_trainer = is_text_trainer(self.trainer)
        if text_trainer != (self.scenario == "code_validation"):
            raise ValueError(
                f"trainer '{self.trainer}' cannot train scenario '{self.scenario}'"
            )
        if not (info.context or {}).get("stored"):  # a stored run keeps loading (docs/behaviour.md#b43)
            unread = unread_fields(self)
            if unread:
                raise FieldProblems(unread)
        return self

    # -- access ------------------------------------------------------------------------

    def agent_params(self, agent_name: str) -> AgentParameters:
        """Parameters of ``agent_name``, falling back to the ``"_default"`` entry."""
        return self.agents.get(agent_name, self.agents[DEFAULT_AGENT_KEY])

    # -- serialisation -----------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-compatible nested dict; ``from_dict`` inverts it exactly."""
        return self.model_dump(mode="json")

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str | None = None, *, stored: bool = False) -> "HyperParameters":
        """Validate a nested dict; errors name the dotted field path (and ``source``).

        ``stored``: the parameters of an existing run (its ``hyper_params.json``, a W&B
        restore): fields its trainer does not read are not refused, so that runs made before
        that refusal keep loading and resuming.
        """
        key = _build_key(data, stored)
        built = _BUILT.get(key) if key is not None else None
        if built is not None and type(built) is cls:
            return built
        try:
            hp = cls.model_validate(data, context={"stored": True} if stored else None)
        except ValidationError as e:
            raise ParameterError(problems_from_validation_error(e), source) from None
        if key is not None:
            # what the tree writes out builds the same object; a tree valid for a new run is
            # valid as a stored one (stored only relaxes refusals), not the other way round
            _BUILT.remember([key, *(_build_key(hp.to_dict(), mode) for mode in ((True,) if stored else (False, True)))],
                            hp)
        return hp

    def to_json(self) -> str:
        return canonical_json(self.to_dict())

    def params_hash(self, length: int = 16) -> str:
        """Stable hash of the parameters (sha256 of the canonical JSON, hex prefix)."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:length]

    def accepted_params_hashes(self, length: int = 16) -> frozenset[str]:
        """:meth:`params_hash` and the hashes older code gave these parameters: the tree without
        the last ``k`` fields of :data:`FIELDS_ADDED_SINCE_STORED_RUNS`, for every ``k`` whose
        fields all hold the value older runs had."""
        tree = self.to_dict()
        hashes = {self.params_hash(length)}
        for path, old_value in reversed(FIELDS_ADDED_SINCE_STORED_RUNS):
            *groups, leaf = path.split(".")
            node = tree
            for group in groups:
                node = node.get(group) if isinstance(node, dict) else None
            if not isinstance(node, dict) or node.get(leaf, old_value) != old_value:
                break
            node.pop(leaf, None)
            hashes.add(hashlib.sha256(canonical_json(tree).encode()).hexdigest()[:length])
        return frozenset(hashes)

    # -- derived -----------------------------------------------------------------------

    @property
    def is_text_scenario(self) -> bool:
        return is_text_trainer(self.trainer)


class _BuiltParameters:
    """The ``HyperParameters`` this process built, by the canonical JSON of their input (bounded).

    ``from_dict`` validates a parameter tree once per process: the CLI's, the flow's and every
    task's copy of one run's parameters (``RunSpec.params``) are the same object, which is safe
    because parameters are immutable (``ParamsModel`` is frozen).
    """

    def __init__(self, size: int = 64) -> None:
        self._size, self._items, self._lock = size, OrderedDict(), threading.Lock()

    def get(self, key: str) -> "HyperParameters | None":
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
            return found

    def remember(self, keys: list[str], hp: "HyperParameters") -> None:
        with self._lock:
            for key in keys:
                self._items[key] = hp
                self._items.move_to_end(key)
            while len(self._items) > self._size:
                self._items.popitem(last=False)


_BUILT = _BuiltParameters()


def _build_key(data: Any, stored: bool) -> str | None:
    # the trainer names' declarations are part of what validation checks
    try:
        return f"{'stored' if stored else 'new'}:{trainer_specs_generation()}:{canonical_json(data)}"
    except (TypeError, ValueError):  # not a JSON tree (e.g. a model instance): validate every time
        return None


def canonical_json(data: Any) -> str:
    """JSON with sorted keys and no whitespace: the basis of every hash in nipflow."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False)


def diff_params(a: dict[str, Any], b: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted paths at which two nested parameter dicts differ (sorted)."""
    out: list[str] = []
    for key in sorted(set(a) | set(b)):
        path = f"{prefix}{key}"
        if key not in a or key not in b:
            out.append(path)
        elif isinstance(a[key], dict) and isinstance(b[key], dict):
            out.extend(diff_params(a[key], b[key], path + "."))
        elif a[key] != b[key]:
            out.append(path)
    return out

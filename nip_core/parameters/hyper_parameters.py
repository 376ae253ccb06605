"""``HyperParameters``: the complete, hashable specification of an experiment.

Anything that can change a result lives here; run-time options that cannot (device,
logging, where files go) live in ``ExperimentSettings``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from nip_core.parameters.agents import (
    AGENT_PARAMS_BY_SCENARIO,
    AgentParameters,
    AnyAgentParameters,
)
from nip_core.parameters.base import ParameterError, ParamsModel, problems_from_validation_error
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
TrainerType = Literal["vanilla_ppo", "solo_agent", "spg", "reinforce", "pure_text_ei", "pure_text_malt"]
InteractionProtocolType = Literal[
    "nip", "adp", "debate", "merlin_arthur", "mnip", "solo_verifier", "multi_channel_test"
]

TEXT_TRAINERS = frozenset({"pure_text_ei", "pure_text_malt"})
DEFAULT_AGENT_KEY = "_default"


class HyperParameters(ParamsModel):
    """All the parameters of an experiment, as a nested pydantic model.

    ``HyperParameters.model_validate(hp.to_dict()) == hp`` holds exactly, and
    :meth:`params_hash` is stable across processes and machines.
    """

    scenario: ScenarioType
    trainer: TrainerType
    dataset: str
    interaction_protocol: InteractionProtocolType = "nip"
    seed: int = Field(6198, ge=0, lt=2**63)
    functionalize_modules: bool = False
    pretrain_agents: bool = False
    test_size: float = Field(0.2, gt=0.0, lt=1.0)
    d_representation: int = Field(16, gt=0)
    message_size: int = Field(1, gt=0)
    include_linear_message_space: bool = False
    d_linear_message_space: int = Field(2, gt=0)
    agents: dict[str, AnyAgentParameters] = Field(default_factory=dict)
    rl: RlTrainerParameters = Field(default_factory=RlTrainerParameters)
    ppo: CommonPpoParameters = Field(default_factory=CommonPpoParameters)
    vanilla_ppo: VanillaPpoParameters = Field(default_factory=VanillaPpoParameters)
    spg: SpgParameters = Field(default_factory=SpgParameters)
    reinforce: ReinforceParameters = Field(default_factory=ReinforceParameters)
    solo_agent: SoloAgentParameters = Field(default_factory=SoloAgentParameters)
    text_rl: TextRlParameters = Field(default_factory=TextRlParameters)
    pure_text_ei: PureTextEiParameters = Field(default_factory=PureTextEiParameters)
    pure_text_malt: PureTextMaltParameters = Field(default_factory=PureTextMaltParameters)
    code_validation: CodeValidationParameters = Field(default_factory=CodeValidationParameters)
    dataset_options: DatasetParameters = Field(default_factory=DatasetParameters)
    protocol_common: CommonProtocolParameters = Field(default_factory=CommonProtocolParameters)
    nip_protocol: NipProtocolParameters = Field(default_factory=NipProtocolParameters)
    debate_protocol: DebateProtocolParameters = Field(default_factory=DebateProtocolParameters)
    mnip_protocol: MnipProtocolParameters = Field(default_factory=MnipProtocolParameters)
    zk_protocol: ZkProtocolParameters = Field(default_factory=ZkProtocolParameters)
    message_regression: MessageRegressionParameters = Field(default_factory=MessageRegressionParameters)
    base_run: BaseRunParameters = Field(default_factory=BaseRunParameters)

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
    def _check_consistency(self) -> "HyperParameters":
        expected = AGENT_PARAMS_BY_SCENARIO[self.scenario]
        if DEFAULT_AGENT_KEY not in self.agents:
            # Assigning through __dict__ avoids re-running validation on a partial model.
            self.__dict__["agents"] = {DEFAULT_AGENT_KEY: expected(), **self.agents}
        for name, agent in self.agents.items():
            if not agent.is_random and not isinstance(agent, expected):
                raise ValueError(
                    f"agents.{name}: parameters of kind '{getattr(agent, 'kind', '?')}' "
                    f"do not fit scenario '{self.scenario}'"
                )
        text_trainer = self.trainer in TEXT_TRAINERS
        if text_trainer != (self.scenario == "code_validation"):
            raise ValueError(
                f"trainer '{self.trainer}' cannot train scenario '{self.scenario}'"
            )
        if self.protocol_common.zero_knowledge and self.scenario == "code_validation":
            raise ValueError("protocol_common.zero_knowledge is not available for code_validation")
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
    def from_dict(cls, data: dict[str, Any], source: str | None = None) -> "HyperParameters":
        """Validate a nested dict; errors name the dotted field path (and ``source``)."""
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            raise ParameterError(problems_from_validation_error(e), source) from None

    def to_json(self) -> str:
        return canonical_json(self.to_dict())

    @classmethod
    def from_json_file(cls, path: str | Path) -> "HyperParameters":
        path = Path(path)
        try:
            text = path.read_text()
        except OSError as e:
            raise ParameterError([("<file>", f"cannot read: {e.strerror}")], str(path)) from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ParameterError([("<file>", f"not valid JSON (line {e.lineno}: {e.msg})")],
                                 str(path)) from None
        if not isinstance(data, dict):
            raise ParameterError([("<root>", "expected a JSON object")], str(path))
        return cls.from_dict(data, source=str(path))

    def params_hash(self, length: int = 16) -> str:
        """Stable hash of the parameters (sha256 of the canonical JSON, hex prefix)."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:length]

    # -- derived -----------------------------------------------------------------------

    @property
    def is_text_scenario(self) -> bool:
        return self.trainer in TEXT_TRAINERS


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

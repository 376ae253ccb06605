"""Hyper-parameters of an experiment (pydantic v2)."""

from nip_core.parameters.agents import (
    AgentParameters,
    AlternatingPeriodicUpdateSchedule,
    CodeValidationAgentParameters,
    ConstantUpdateSchedule,
    ContiguousPeriodicUpdateSchedule,
    GraphIsomorphismAgentParameters,
    LrFactors,
    OracleProverParameters,
    RandomAgentParameters,
)
from nip_core.parameters.base import BaseRunPreserve, ParameterError, ParamsModel
from nip_core.parameters.hyper_parameters import (
    DEFAULT_AGENT_KEY,
    HyperParameters,
    InteractionProtocolType,
    ScenarioType,
    TrainerType,
    canonical_json,
    diff_params,
)
from nip_core.parameters.overrides import apply_overrides, parse_override
from nip_core.parameters.protocols import (
    CommonProtocolParameters,
    DebateProtocolParameters,
    MnipProtocolParameters,
    NipProtocolParameters,
    ZkProtocolParameters,
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
)

__all__ = [name for name in dir() if not name.startswith("_")]

"""The fields of the experiment form: one annotated type each, with its description.

:class:`flows.parameters.ExperimentParameters` declares its fields with these types, and the
flows that take the fields as top-level flow parameters (``train_experiment``, ``sweep``,
``scheduled_retraining``) use the same types in their signatures, so that a deployment's
defaults and a run's ``--param x=...`` merge field by field (Prefect merges run
parameters one top-level key at a time). The dropdowns (scenario, trainer, protocol,
dataset) are enums built from the registries when this module is imported; a trainer is
checked against the registry when a value is validated, so one registered after this
import (a user's module imported later) is accepted although the form does not list it.

Prefect reads the descriptions of a flow's parameters from its Google-style docstring, not
from ``Field(description=...)``: :func:`described_by` writes them there.
"""

from __future__ import annotations

import inspect
from typing import Annotated, Any, Callable, Literal, Optional, TypeVar, get_args

from pydantic import AfterValidator, BaseModel, Field, WithJsonSchema

from flows.secret_blocks import SECRET_SETTINGS_FIELDS
from nip_core.parameters import HyperParameters, InteractionProtocolType, ScenarioType
from nip_core.parameters.partial import partial_model
from nip_core.scenarios.code_validation.dataset import dataset_names as code_validation_dataset_names
from nip_core.scenarios.graph_isomorphism.named_datasets import NAMED_DATASETS
from nip_core.settings import DEVICE_DESCRIPTION
from nip_core.parameters.trainer_specs import registered_trainer_names

WaitMode = Literal["auto", "poll", "suspend"]

# -- the dropdowns of the form, built from the registries when this module is imported ----

#: scenario names (those ``HyperParameters.scenario`` accepts)
SCENARIO_NAMES: tuple[str, ...] = tuple(get_args(ScenarioType))
#: registered trainers (the built-ins as nip_core/parameters/trainer_specs.py states them, and any imported)
TRAINER_NAMES: tuple[str, ...] = tuple(registered_trainer_names())
#: the interaction protocols HyperParameters accepts (any scenario)
PROTOCOL_NAMES: tuple[str, ...] = tuple(sorted(get_args(InteractionProtocolType)))
#: scenario -> the datasets it can load by name
DATASETS_BY_SCENARIO: dict[str, tuple[str, ...]] = {
    "graph_isomorphism": tuple(sorted(NAMED_DATASETS)),
    "code_validation": tuple(code_validation_dataset_names()),
}
#: every dataset of the form (the form cannot depend on the scenario chosen)
DATASET_NAMES: tuple[str, ...] = tuple(sorted({n for names in DATASETS_BY_SCENARIO.values() for n in names}))


def _registered_trainer(name: str) -> str:
    names = registered_trainer_names()
    if name not in names:
        # the input is not quoted: error messages of flow parameters hide inputs (a secret?)
        raise ValueError(f"Input should be a registered trainer: {', '.join(repr(n) for n in names)}")
    return name


# the form lists TRAINER_NAMES; a value is checked against the registry when it is validated
ScenarioName = Literal[SCENARIO_NAMES]  # type: ignore[valid-type]
TrainerName = Annotated[str, AfterValidator(_registered_trainer),
                        WithJsonSchema({"type": "string", "enum": list(TRAINER_NAMES)})]
ProtocolName = Literal[PROTOCOL_NAMES]  # type: ignore[valid-type]
DatasetName = Literal[DATASET_NAMES]  # type: ignore[valid-type]

#: every field of ``HyperParameters`` optional (nested groups too), same types and descriptions
PartialHyperParameters = partial_model(HyperParameters)

#: the block size of TensorDict trainers when the form leaves it alone
DEFAULT_BLOCK_SIZE = 10

# JSON schema of a settings mapping: names of secret fields are not allowed as keys.
NO_SECRET_KEYS_SCHEMA = {"propertyNames": {"not": {"enum": sorted(SECRET_SETTINGS_FIELDS)}}}


# -- one annotated type per field ---------------------------------------------------------


ScenarioField = Annotated[Optional[ScenarioName], Field(
    description="the task the agents learn (graph isomorphism or code validation); empty: params.scenario")]
TrainerField = Annotated[Optional[TrainerName], Field(
    description="the training algorithm; TensorDict trainers (vanilla_ppo, spg, reinforce) and solo_agent "
                "train graph isomorphism, text trainers (pure_text_*) code validation")]
ProtocolField = Annotated[Optional[ProtocolName], Field(
    description="the interaction protocol (who speaks when, who is paid for what); empty: "
                "params.interaction_protocol, else nip")]
DatasetField = Annotated[Optional[DatasetName], Field(
    description="a named dataset of the chosen scenario (" + "; ".join(
        f"{scenario}: {', '.join(names)}" for scenario, names in DATASETS_BY_SCENARIO.items())
    + "); empty: the scenario's default")]
NumIterationsField = Annotated[Optional[int], Field(
    ge=0, description="training iterations (rl.num_iterations; solo_agent: solo_agent.num_epochs)")]
SeedField = Annotated[Optional[int], Field(ge=0, lt=2**63, description="random seed of the experiment (seed)")]
FramesPerBatchField = Annotated[Optional[int], Field(
    gt=0, description="TensorDict trainers: environment steps collected per iteration (rl.frames_per_batch)")]
RolloutsField = Annotated[Optional[int], Field(
    gt=0, description="text trainers: datapoints rolled out per iteration (rl.rollouts_per_iteration)")]
ProverModelField = Annotated[Optional[str], Field(
    min_length=1, description="code validation: model name of every prover of the protocol "
                              "(agents.<prover>.model_name)")]
VerifierModelField = Annotated[Optional[str], Field(
    min_length=1, description="code validation: model name of the verifier (agents.verifier.model_name)")]
ParamsField = Annotated[Optional[PartialHyperParameters], Field(  # type: ignore[valid-type]
    description="any HyperParameters fields (nested); the fields above and overrides take precedence")]
OverridesField = Annotated[Optional[list[str]], Field(
    description="dotted overrides KEY=VALUE, applied last (e.g. rl.lr=0.001)")]
RunIdField = Annotated[Optional[str], Field(description="continue this run (a new id is made when empty)")]
RunsDirField = Annotated[Optional[str], Field(description="run store location: a path or an fsspec URL")]
DeviceField = Annotated[str, Field(description=DEVICE_DESCRIPTION)]
UseWandbField = Annotated[bool, Field(description="log metrics to Weights & Biases")]
BlockSizeField = Annotated[int, Field(
    gt=0, description="TensorDict trainers: iterations per RL block flow run (one GPU task each)")]
WaitModeField = Annotated[WaitMode, Field(
    description="fine-tune waits: poll in-process, or suspend the flow run (auto: suspend when deployed)")]
OnParamsMismatchField = Annotated[Literal["refuse", "warn", "force"], Field(
    description="when run_id exists with other hyper-parameters: refuse, warn and continue, or force the new ones")]
WarmStartFromField = Annotated[Optional[str], Field(description="run id whose final models to start from")]
SettingsOverridesField = Annotated[Optional[dict[str, Any]], Field(
    description="other ExperimentSettings fields (data_dir, openai_base_url, fine_tune_poll_interval_s ...); "
                "never secrets (the API key comes from the worker)", json_schema_extra=NO_SECRET_KEYS_SCHEMA)]


F = TypeVar("F", bound=Callable[..., Any])


def described_by(model: type[BaseModel]) -> Callable[[F], F]:
    """Add an ``Args:`` section describing each parameter of the decorated flow function that is
    a field of ``model`` (with that field's description), unless the docstring already has one.

    Prefect reads the descriptions of a flow's parameters from its (Google-style) docstring
    for the deployment's form: this keeps the descriptions of the form's fields in one place.
    Apply it below ``@flow``.
    """
    def decorate(fn: F) -> F:
        doc = inspect.cleandoc(fn.__doc__ or "")
        lines = [f"    {name}: {model.model_fields[name].description}"
                 for name in inspect.signature(fn).parameters
                 if name in model.model_fields and model.model_fields[name].description
                 and f"\n    {name}:" not in doc]
        if lines:
            head, sep, tail = doc.partition("\n\nArgs:\n")
            doc = f"{head}\n\nArgs:\n" + "\n".join(lines) + ("\n" + tail if sep else "")
        fn.__doc__ = doc
        return fn
    return decorate

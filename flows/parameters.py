"""Typed flow parameters, so that the Prefect UI shows a form for each deployment.

Secrets (the ``SecretStr`` fields of ``ExperimentSettings``, e.g. ``openai_api_key``) are
refused here, so that Prefect, which stores parameters in plain text and copies them into
child runs, never holds one: the validators reject them before a run starts, and the
JSON schema (``propertyNames``) makes a server that enforces deployment parameter schemas
reject them before it stores the run. Flows take the key from the worker instead
(:mod:`flows.secret_blocks`).

The form of ``train_experiment`` is typed throughout (:mod:`flows.form_fields`): scenario,
trainer, protocol and dataset are enums built from the registries (so the UI shows
dropdowns), the everyday knobs are typed fields, and ``params`` is the whole
``HyperParameters`` tree as a nested form in which every field is optional
(:func:`nip_core.parameters.partial.partial_model`); a plain dict still validates into it.
Each field is a top-level flow parameter of the flows that take it;
:class:`ExperimentParameters` gathers them (:meth:`ExperimentParameters.from_flow_parameters`).
"""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from flows.form_fields import (
    DATASETS_BY_SCENARIO,
    DEFAULT_BLOCK_SIZE,
    NO_SECRET_KEYS_SCHEMA,
    BlockSizeField,
    DatasetField,
    DeviceField,
    FramesPerBatchField,
    NumIterationsField,
    OnParamsMismatchField,
    OverridesField,
    ParamsField,
    PartialHyperParameters,
    ProtocolField,
    ProverModelField,
    RolloutsField,
    RunIdField,
    RunsDirField,
    ScenarioField,
    SeedField,
    SettingsOverridesField,
    TrainerField,
    UseWandbField,
    VerifierModelField,
    WaitModeField,
    WarmStartFromField,
)
from flows.secret_blocks import SECRET_SETTINGS_FIELDS, secret_parameter_error, with_secrets
from nip_core.errors import NipflowError
from nip_core.experiment import DEFAULT_DATASETS, new_run_id
from nip_core.parameters import HyperParameters, ParameterError, apply_overrides
from nip_core.runs import validate_run_id
from nip_core.settings import AUTO_DEVICE, ExperimentSettings, check_device_name
from nip_core.parameters.trainer_specs import UnknownTrainerError, trainer_kind


class MissingParameterError(NipflowError):
    """A flow run was started without a parameter it needs (every flow parameter is
    optional in the schema, so that deployments can be edited and saved in the UI)."""

    def __init__(self, flow_name: str, parameter: str, hint: str):
        self.flow_name = flow_name
        self.parameter = parameter
        super().__init__(f"{flow_name}: parameter '{parameter}' is missing: {hint}")


def refuse_secret_keys(mapping: dict[str, Any], path: str) -> dict[str, Any]:
    """Raise ``ValueError`` (naming ``path.key``) if ``mapping`` has a secret settings field."""
    for key in mapping:
        if key in SECRET_SETTINGS_FIELDS:
            raise ValueError(secret_parameter_error(f"{path}.{key}"))
    return mapping


def refuse_secret_overrides(overrides: list[str], path: str) -> list[str]:
    """Raise ``ValueError`` if a ``KEY=VALUE`` override (or grid key) targets a secret field."""
    for item in overrides:
        key = str(item).split("=", 1)[0].strip()
        if key.rsplit(".", 1)[-1] in SECRET_SETTINGS_FIELDS:
            raise ValueError(secret_parameter_error(f"{path} '{key}'"))
    return overrides


# -- the everyday knobs: where each goes in the HyperParameters tree ----------------------

_KIND_LABELS = {"tensordict": "TensorDict trainers", "pure_text": "text trainers",
                "solo": "the solo_agent trainer"}


def _knob_target(knob: str, kind: str, scenario: str) -> tuple[str, ...] | str:
    """The dotted path ``knob`` sets for a trainer of ``kind``, or why it does not apply."""
    if knob == "seed":
        return ("seed",)
    if knob == "num_iterations":
        return ("solo_agent", "num_epochs") if kind == "solo" else ("rl", "num_iterations")
    if knob == "frames_per_batch":
        return ("rl", "frames_per_batch") if kind == "tensordict" else "applies to TensorDict trainers only"
    if knob == "rollouts_per_iteration":
        return ("rl", "rollouts_per_iteration") if kind == "pure_text" else "applies to text trainers only"
    raise KeyError(knob)  # pragma: no cover - every knob is listed above


def _set_path(data: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = data
    for part in path[:-1]:
        child = node.get(part)
        node = node.setdefault(part, {}) if child is None else child
    node[path[-1]] = value


def _set_model_name(data: dict[str, Any], knob: str, role: str, model_name: str) -> list[tuple[str, str]]:
    """Set ``agents.<agent>.model_name`` of every agent of ``role`` (text agents only)."""
    field = f"parameters.{knob}"
    scenario = data["scenario"]
    if scenario != "code_validation":
        return [(field, f"applies to the code_validation scenario (text agents) only, not to '{scenario}'")]
    from nip_core.protocols import get_protocol_handler_class  # torch: only for text knobs

    protocol = data.get("interaction_protocol") or HyperParameters.model_fields["interaction_protocol"].default
    try:
        names = [a for a in get_protocol_handler_class(protocol, scenario).AGENTS if role in a]
    except Exception as e:  # noqa: BLE001 - an unknown protocol, reported against the field
        return [(field, f"cannot tell the agents of protocol '{protocol}': {e}")]
    if not names:
        return [(field, f"protocol '{protocol}' has no {role}")]
    agents = data.setdefault("agents", {})
    default = agents.get("_default") or {}
    problems = []
    for name in names:
        # An agent not listed uses the "_default" entry: a new entry starts from a copy of it.
        entry = agents.get(name)
        entry = dict(entry) if isinstance(entry, dict) else dict(default)
        if entry.get("kind") == "random":
            problems.append((field, f"agent '{name}' is a random agent, which has no model"))
            continue
        entry["model_name"] = model_name
        agents[name] = entry
    return problems


class ExperimentParameters(BaseModel):
    """What a user fills in to start (or continue) an experiment from the Prefect UI.

    The hyper-parameters are built from three layers, each taking precedence over the one
    before (as on the command line):

    1. ``params``: any part of the ``HyperParameters`` tree, as a nested form (a plain
       dict is accepted too);
    2. the typed fields: ``scenario``, ``trainer``, ``protocol``, ``dataset`` and the
       everyday knobs ``num_iterations``, ``seed``, ``frames_per_batch``,
       ``rollouts_per_iteration``, ``prover_model`` and ``verifier_model``;
    3. ``overrides``: dotted ``KEY=VALUE`` strings (``rl.num_iterations=50``).

    A knob that does not apply to the chosen trainer or scenario (``frames_per_batch``
    for a text trainer) is refused with an error naming it, as is a ``dataset`` that
    the chosen scenario cannot load. ``block_size`` and ``device`` are run settings, not
    hyper-parameters.
    """

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)  # inputs may hold a secret

    scenario: ScenarioField = None
    trainer: TrainerField = None
    protocol: ProtocolField = None
    dataset: DatasetField = None
    num_iterations: NumIterationsField = None
    seed: SeedField = None
    frames_per_batch: FramesPerBatchField = None
    rollouts_per_iteration: RolloutsField = None
    prover_model: ProverModelField = None
    verifier_model: VerifierModelField = None
    params: ParamsField = Field(default_factory=PartialHyperParameters)
    overrides: OverridesField = Field(default_factory=list)
    run_id: RunIdField = None
    runs_dir: RunsDirField = None
    device: DeviceField = AUTO_DEVICE
    use_wandb: UseWandbField = False
    block_size: BlockSizeField = DEFAULT_BLOCK_SIZE
    wait_mode: WaitModeField = "auto"
    on_params_mismatch: OnParamsMismatchField = "refuse"
    warm_start_from: WarmStartFromField = None
    settings_overrides: SettingsOverridesField = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _no_secret_fields(cls, data: Any) -> Any:
        # A top-level ``openai_api_key`` would be refused as an extra field anyway; this
        # says why and where the key belongs instead.
        if isinstance(data, dict):
            refuse_secret_keys(data, "parameters")
        return data

    @field_validator("params", mode="before")
    @classmethod
    def _legacy_params(cls, value: Any) -> Any:
        # ``null`` is an empty tree; ``is_random: true`` (as HyperParameters accepts it)
        # becomes ``kind: random``, which the partial agent models know.
        if value is None:
            return {}
        if isinstance(value, dict) and isinstance(value.get("agents"), dict):
            agents = {}
            for name, agent in value["agents"].items():
                if isinstance(agent, dict) and "is_random" in agent:
                    agent = {k: v for k, v in agent.items() if k != "is_random"}
                    if value["agents"][name]["is_random"]:
                        agent.setdefault("kind", "random")
                agents[name] = agent
            value = {**value, "agents": agents}
        return value

    @field_validator("overrides", "settings_overrides", mode="before")
    @classmethod
    def _none_is_empty(cls, value: Any, info) -> Any:
        # a flow parameter left empty (``null``) is the empty list or mapping
        if value is None:
            return [] if info.field_name == "overrides" else {}
        return value

    @field_validator("settings_overrides")
    @classmethod
    def _no_secret_settings(cls, value: dict[str, Any]) -> dict[str, Any]:
        return refuse_secret_keys(value, "settings_overrides")

    @classmethod
    def from_flow_parameters(cls, values: dict[str, Any]) -> "ExperimentParameters":
        """The fields among a flow run's parameters (the flow's ``locals()`` at its start, or
        a flow run's stored ``parameters``); ``None`` means "not given", other keys are the
        flow's own (a sweep's ``grid``).

        A run created before the fields became top-level flow parameters has one parameter,
        ``parameters``, holding them all (a run suspended by an older version and resumed
        by this one): it is read as such.
        """
        if set(values) == {"parameters"} and isinstance(values["parameters"], dict):
            values = values["parameters"]
        return cls.model_validate({k: v for k, v in values.items() if k in cls.model_fields and v is not None})

    def flow_parameters(self, mode: Literal["python", "json"] = "python") -> dict[str, Any]:
        """The fields that differ from their defaults, as flow parameters (``train_experiment(**...)``,
        ``run_deployment(parameters=...)`` with ``mode="json"``)."""
        defaults = type(self)()
        return {k: v for k, v in self.model_dump(mode=mode).items()
                if getattr(self, k) != getattr(defaults, k)}

    @field_validator("overrides")
    @classmethod
    def _no_secret_overrides(cls, value: list[str]) -> list[str]:
        return refuse_secret_overrides(value, "overrides")

    @field_validator("device")
    @classmethod
    def _device_name(cls, value: str) -> str:
        # Only the name here: whether the device exists is known on the host that trains.
        return check_device_name(value)

    def hyper_params(self) -> HyperParameters:
        """Validate and build the ``HyperParameters`` (``params`` < typed fields < ``overrides``).

        Raises
        ------
        ParameterError
            If a value is invalid; if the scenario or the trainer is given neither as a
            field (``parameters.scenario``) nor in ``params`` (an empty form); if the
            dataset does not belong to the scenario; or if a knob does not apply to the
            trainer or scenario (the error names ``parameters.<knob>``).
        """
        data = self.params.model_dump(mode="json")
        for field, key in (("scenario", "scenario"), ("trainer", "trainer"),
                           ("protocol", "interaction_protocol"), ("dataset", "dataset")):
            if getattr(self, field):
                data[key] = getattr(self, field)
        missing = [(f"parameters.{key}", f"missing: set parameters.{key} (or parameters.params.{key})")
                   for key in ("scenario", "trainer") if not data.get(key)]
        if missing:
            raise ParameterError(missing, source="flow parameters")
        if "dataset" not in data and data.get("scenario") in DEFAULT_DATASETS:
            data["dataset"] = DEFAULT_DATASETS[data["scenario"]]
        problems = self._apply_knobs(data)
        if problems:
            raise ParameterError(problems, source="flow parameters")
        return HyperParameters.from_dict(apply_overrides(data, self.overrides), source="flow parameters")

    def _apply_knobs(self, data: dict[str, Any]) -> list[tuple[str, str]]:
        """Set the typed knobs in ``data`` (in place); the problems with the ones that do not apply."""
        scenario, trainer = data["scenario"], data["trainer"]
        problems: list[tuple[str, str]] = []
        valid = DATASETS_BY_SCENARIO.get(scenario)
        if self.dataset is not None and valid is not None and self.dataset not in valid:
            problems.append(("parameters.dataset", f"'{self.dataset}' is not a {scenario} dataset "
                                                   f"(valid: {', '.join(valid)})"))
        try:
            kind = trainer_kind(trainer)
        except UnknownTrainerError as e:
            return problems + [("parameters.params.trainer", str(e))]
        for knob in ("num_iterations", "seed", "frames_per_batch", "rollouts_per_iteration"):
            value = getattr(self, knob)
            if value is None:
                continue
            target = _knob_target(knob, kind, scenario)
            if isinstance(target, str):
                problems.append((f"parameters.{knob}", f"{target}, not to trainer '{trainer}' "
                                                       f"({_KIND_LABELS[kind]})"))
            else:
                _set_path(data, target, value)
        if self.block_size != DEFAULT_BLOCK_SIZE and kind != "tensordict":
            problems.append(("parameters.block_size", f"applies to TensorDict trainers only, not to trainer "
                                                      f"'{trainer}' ({_KIND_LABELS[kind]})"))
        for knob, role in (("prover_model", "prover"), ("verifier_model", "verifier")):
            value = getattr(self, knob)
            if value is not None:
                problems.extend(_set_model_name(data, knob, role, value))
        return problems

    def run_spec(self, flow_run_id: Optional[str] = None) -> "RunSpec":
        """The form resolved into the run it describes: the one carrier from here on.

        A flow resolves its form once, at its start; the trainer, the RL blocks and the tasks
        are built from this spec (the lease claim is added by :meth:`RunSpec.for_trainer`).
        The spec holds no secret: a worker adds its own (:meth:`RunSpec.experiment_settings`).
        """
        hyper_params = self.hyper_params()
        return RunSpec.of(hyper_params, self.settings(hyper_params, flow_run_id))

    def settings(self, hyper_params: HyperParameters, flow_run_id: Optional[str] = None) -> ExperimentSettings:
        """The run-time settings the form asks for, without secrets (a worker adds its own:
        :meth:`RunSpec.experiment_settings`); without ``run_id`` the run id derives from
        ``flow_run_id``.

        A flow run keeps its id when it is resumed after a suspension or rescheduled
        after a crash, so the derived run id (and all its cached work) stays the same.
        """
        if self.run_id:
            run_id = validate_run_id(self.run_id)
        elif flow_run_id:
            run_id = (f"{hyper_params.scenario[:2]}-{hyper_params.trainer}-{hyper_params.interaction_protocol}"
                      f"-{str(flow_run_id).replace('-', '')[:12]}")
        else:
            run_id = new_run_id(hyper_params)
        values: dict[str, Any] = {
            "run_id": run_id,
            "device": self.device, "use_wandb": self.use_wandb,
            "on_params_mismatch": self.on_params_mismatch, "show_progress": False,
        }
        if self.run_id is None and "run_id" in self.settings_overrides:
            values["run_id"] = validate_run_id(self.settings_overrides["run_id"])
        if self.runs_dir:
            values["runs_dir"] = self.runs_dir
        values.update(self.settings_overrides)
        return ExperimentSettings(**values)


class RunSpec(BaseModel):
    """Everything a child flow run (maybe on another machine) needs to open a run.

    ``settings`` carries the device as the user asked for it (``"auto"`` by default): the
    child resolves it on its own host. Both fields default to empty (so that a form in
    the UI can be saved); a child refuses an empty spec (:meth:`require_complete`).
    """

    params: dict[str, Any] = Field(default_factory=dict, description="the run's HyperParameters")
    settings: dict[str, Any] = Field(default_factory=dict, description="the run's ExperimentSettings "
                                     "(never secrets)", json_schema_extra=NO_SECRET_KEYS_SCHEMA)
    lease: Optional[dict[str, Any]] = Field(None, description="the parent's claim on the run lease "
                                            "({owner, generation}); a child joins it instead of taking its own")

    @field_validator("settings")
    @classmethod
    def _no_secret_settings(cls, value: dict[str, Any]) -> dict[str, Any]:
        return refuse_secret_keys(value, "spec.settings")

    @classmethod
    def of(cls, hyper_params: HyperParameters, settings: ExperimentSettings) -> "RunSpec":
        # Secret fields are excluded from dumps already; naming them again keeps a secret
        # added later without ``exclude=True`` out of child runs' parameters too.
        return cls(params=hyper_params.to_dict(),
                   settings=settings.model_dump(mode="json", exclude=set(SECRET_SETTINGS_FIELDS)))

    @classmethod
    def for_trainer(cls, trainer: Any, settings: ExperimentSettings | None = None) -> "RunSpec":
        """The spec of ``trainer``'s run, with the lease claim this process holds on it.

        ``settings`` replaces the trainer's (the RL blocks pass the device as asked, not
        as this host resolved it).
        """
        spec = cls.of(trainer.hyper_params, settings or trainer.settings)
        return spec.model_copy(update={"lease": trainer.run.lock.claim()})

    def require_complete(self, flow_name: str) -> "RunSpec":
        """``self``, or ``MissingParameterError`` naming ``spec.params``/``spec.settings.run_id``."""
        hint = "the RunSpec of a run, which train_experiment passes to every block it starts"
        if not self.params:
            raise MissingParameterError(flow_name, "spec.params", hint)
        if not self.settings.get("run_id"):
            raise MissingParameterError(flow_name, "spec.settings.run_id", hint)
        return self

    @property
    def device(self) -> str:
        """The device as asked (``"auto"`` when the settings do not say)."""
        return str(self.settings.get("device") or ExperimentSettings.model_fields["device"].default)

    def hyper_params(self) -> HyperParameters:
        return HyperParameters.from_dict(self.params, source="run spec")

    def experiment_settings(self) -> ExperimentSettings:
        """The settings of the run, with the secrets of the worker running the child."""
        return with_secrets(ExperimentSettings(**self.settings))

"""Typed flow parameters, so that the Prefect UI shows a form for each deployment.

Secrets (the ``SecretStr`` fields of ``ExperimentSettings``, e.g. ``openai_api_key``) are
refused here, so that Prefect, which stores parameters in plain text and copies them into
child runs, never holds one: the validators reject them before a run starts, and the
JSON schema (``propertyNames``) makes a server that enforces deployment parameter schemas
reject them before it stores the run. Flows take the key from the worker instead
(:mod:`flows.secrets`).
"""

from __future__ import annotations

import json
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from flows.secrets import SECRET_SETTINGS_FIELDS, secret_parameter_error, with_secrets
from nip_core.errors import NipflowError
from nip_core.experiment import DEFAULT_DATASETS, new_run_id
from nip_core.parameters import HyperParameters, ParameterError, apply_overrides
from nip_core.runs import validate_run_id
from nip_core.settings import AUTO_DEVICE, DEVICE_DESCRIPTION, ExperimentSettings, check_device_name

WaitMode = Literal["auto", "poll", "suspend"]

# JSON schema of a settings mapping: names of secret fields are not allowed as keys.
NO_SECRET_KEYS_SCHEMA = {"propertyNames": {"not": {"enum": sorted(SECRET_SETTINGS_FIELDS)}}}


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


class ExperimentParameters(BaseModel):
    """What a user fills in to start (or continue) an experiment from the Prefect UI.

    ``params`` is a full or partial ``HyperParameters`` tree; the scenario, trainer,
    protocol and dataset fields and then each ``overrides`` entry (``rl.num_iterations=50``)
    take precedence over it, as on the command line.
    """

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)  # inputs may hold a secret

    scenario: Optional[Literal["graph_isomorphism", "code_validation"]] = None
    trainer: Optional[str] = Field(None, description="vanilla_ppo, spg, reinforce, solo_agent, pure_text_ei, pure_text_malt")
    protocol: Optional[str] = Field(None, description="nip, adp, debate, mnip, merlin_arthur, solo_verifier")
    dataset: Optional[str] = None
    params: dict[str, Any] = Field(default_factory=dict, description="HyperParameters as JSON (optional)")
    overrides: list[str] = Field(default_factory=list, description="dotted overrides KEY=VALUE")
    run_id: Optional[str] = Field(None, description="continue this run (a new id is made when empty)")
    runs_dir: Optional[str] = Field(None, description="run store location: a path or an fsspec URL")
    device: str = Field(AUTO_DEVICE, description=DEVICE_DESCRIPTION)
    use_wandb: bool = False
    block_size: int = Field(10, gt=0, description="TensorDict trainers: iterations per GPU block")
    wait_mode: WaitMode = Field("auto", description="fine-tune waits: poll in-process, or suspend the "
                                                    "flow run (auto: suspend when deployed)")
    on_params_mismatch: Literal["refuse", "warn", "force"] = "refuse"
    warm_start_from: Optional[str] = Field(None, description="run id whose final models to start from")
    settings_overrides: dict[str, Any] = Field(default_factory=dict, description="other ExperimentSettings fields "
                                               "(data_dir, openai_base_url, fine_tune_poll_interval_s ...); "
                                               "never secrets (the API key comes from the worker)",
                                               json_schema_extra=NO_SECRET_KEYS_SCHEMA)

    @model_validator(mode="before")
    @classmethod
    def _no_secret_fields(cls, data: Any) -> Any:
        # A top-level ``openai_api_key`` would be refused as an extra field anyway; this
        # says why and where the key belongs instead.
        if isinstance(data, dict):
            refuse_secret_keys(data, "parameters")
        return data

    @field_validator("settings_overrides")
    @classmethod
    def _no_secret_settings(cls, value: dict[str, Any]) -> dict[str, Any]:
        return refuse_secret_keys(value, "settings_overrides")

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
        """Validate and build the ``HyperParameters``.

        Raises
        ------
        ParameterError
            If a value is invalid, or if the scenario or the trainer is given neither as
            a field (``parameters.scenario``) nor in ``params`` (an empty form).
        """
        data = json.loads(json.dumps(self.params))
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
        return HyperParameters.from_dict(apply_overrides(data, self.overrides), source="flow parameters")

    def settings(self, hyper_params: HyperParameters, flow_run_id: Optional[str] = None) -> ExperimentSettings:
        """The run-time settings; without ``run_id`` the run id derives from ``flow_run_id``.

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
        return with_secrets(ExperimentSettings(**values))


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

"""The OpenAI key: read on the worker (env, else the Secret block), never a flow parameter."""

from __future__ import annotations

import json
import logging

import pytest
from pydantic import ValidationError

from flows.parameters import ExperimentParameters, RunSpec
from flows.prefect_setup import OPENAI_SECRET_BLOCK

BLOCK_KEY = "sk-from-the-block-7f3a9c"
ENV_KEY = "sk-from-the-env-51d2e8"
PARAM_KEY = "sk-given-as-parameter-0b6e4d"


def _gi_params(tmp_path, run_id, **kw) -> ExperimentParameters:
    return ExperimentParameters(scenario="graph_isomorphism", trainer="vanilla_ppo", run_id=run_id,
                                runs_dir=str(tmp_path / "runs"), overrides=["rl.num_iterations=2"],
                                block_size=1, **kw)


@pytest.fixture
def secret_block(prefect_server, monkeypatch):
    """The Secret block ``nipflow-openai-api-key`` on the test server; $OPENAI_API_KEY unset."""
    from prefect.blocks.system import Secret

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    Secret(value=BLOCK_KEY).save(OPENAI_SECRET_BLOCK, overwrite=True)
    yield BLOCK_KEY
    Secret.delete(OPENAI_SECRET_BLOCK)  # the server is shared by the whole session


# -- (a) secrets are refused as parameters ------------------------------------------------------


@pytest.mark.parametrize("build", [
    lambda: ExperimentParameters(settings_overrides={"openai_api_key": PARAM_KEY}),
    lambda: ExperimentParameters.model_validate({"settings_overrides": {"openai_api_key": PARAM_KEY,
                                                                        "data_dir": "d"}}),
    lambda: ExperimentParameters.model_validate_json(json.dumps({"settings_overrides": {"openai_api_key": PARAM_KEY}})),
], ids=["constructor", "dict", "json"])
def test_settings_override_with_the_key_is_refused_naming_the_field(build):
    with pytest.raises(ValidationError) as info:
        build()
    text = str(info.value)
    assert "settings_overrides.openai_api_key: secrets are not accepted as flow parameters" in text
    assert "OPENAI_API_KEY" in text and OPENAI_SECRET_BLOCK in text  # says where the key belongs
    assert PARAM_KEY not in text  # the message does not quote the input


def test_other_places_for_the_key_are_refused_too():
    with pytest.raises(ValidationError, match="parameters.openai_api_key: secrets") as info:
        ExperimentParameters.model_validate({"openai_api_key": PARAM_KEY})
    assert PARAM_KEY not in str(info.value)
    with pytest.raises(ValidationError, match="overrides 'text_rl.openai_api_key': secrets"):
        ExperimentParameters(overrides=[f"text_rl.openai_api_key={PARAM_KEY}"])
    with pytest.raises(ValidationError, match="spec.settings.openai_api_key: secrets"):
        RunSpec(params={}, settings={"run_id": "r", "openai_api_key": PARAM_KEY})


def test_secret_fields_are_derived_from_the_settings_types():
    from pydantic import SecretStr, create_model

    from flows.secret_blocks import SECRET_SETTINGS_FIELDS, _holds_secret
    from nip_core.settings import ExperimentSettings

    assert SECRET_SETTINGS_FIELDS == {"openai_api_key"}
    assert "openai_base_url" not in SECRET_SETTINGS_FIELDS
    # any other SecretStr field would be found the same way
    model = create_model("M", token=(SecretStr | None, None), plain=(str, ""))
    assert [n for n, f in model.model_fields.items() if _holds_secret(f.annotation)] == ["token"]
    assert ExperimentSettings(openai_api_key="x").model_dump(mode="json").get("openai_api_key") is None


def test_flow_parameter_schemas_refuse_the_key_before_a_run_is_stored():
    """What a server enforcing deployment parameter schemas checks on ``create_flow_run``."""
    from prefect.utilities.callables import parameter_schema
    from prefect.utilities.schema_tools.validation import validate

    from flows.experiment import train_experiment
    from flows.sweep import sweep
    from flows.rl_blocks import rl_iteration_block

    def errors(fn, values):
        schema = parameter_schema(fn).model_dump_for_openapi()
        return validate(values, schema, raise_on_error=False, preprocess=True, ignore_required=True)

    assert errors(train_experiment.fn, {"settings_overrides": {"openai_api_key": PARAM_KEY}})
    assert not errors(train_experiment.fn, {"settings_overrides": {"data_dir": "d"}})
    assert errors(rl_iteration_block.fn, {"spec": {"params": {}, "settings": {"openai_api_key": PARAM_KEY}}})
    assert errors(sweep.fn, {"grid": {"settings.openai_api_key": [PARAM_KEY]}, "sweep_id": "s"})
    assert errors(sweep.fn, {"settings_overrides": {"openai_api_key": PARAM_KEY}, "grid": {}, "sweep_id": "s"})
    assert not errors(sweep.fn, {"grid": {"seed": [1, 2]}, "sweep_id": "s"})


def test_sweep_cannot_hand_the_key_to_children():
    from flows.sweep import point_parameters, sweep

    with pytest.raises(Exception, match="grid 'openai_api_key': secrets are not accepted") as info:
        sweep.validate_parameters({"grid": {"openai_api_key": [PARAM_KEY]}, "sweep_id": "s"})
    assert PARAM_KEY not in str(info.value)
    base = ExperimentParameters(scenario="graph_isomorphism", trainer="vanilla_ppo")
    with pytest.raises(ValidationError, match="secrets are not accepted"):
        point_parameters(base, "s", 0, {"text_rl.openai_api_key": PARAM_KEY})  # children are validated


def test_cli_parameters_never_carry_the_key(tmp_path):
    from flows.entry import experiment_parameters
    from nip_core.experiment import make_params
    from nip_core.settings import ExperimentSettings

    hp = make_params("graph_isomorphism", "vanilla_ppo")
    settings = ExperimentSettings(run_id="gi-1", runs_dir=str(tmp_path), openai_api_key=PARAM_KEY)
    assert PARAM_KEY not in experiment_parameters(hp, settings).model_dump_json()


# -- (b) the Secret block reaches the settings, and nothing else ----------------------------------


def test_block_key_reaches_settings_but_no_parameter_spec_log_or_artifact(fakes, secret_block, tmp_path,
                                                                         monkeypatch):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId, LogFilter, \
        LogFilterFlowRunId

    import flows.trainer_access as trainer_access
    from flows.experiment import train_experiment

    built, child_settings = [], []
    real_build = trainer_access.build_flow_trainer
    real_experiment_settings = RunSpec.experiment_settings

    def recording_build(hyper_params, settings):
        built.append(settings)
        return real_build(hyper_params, settings)

    def recording_experiment_settings(spec):
        settings = real_experiment_settings(spec)
        child_settings.append((spec.model_dump_json(), settings))
        return settings

    monkeypatch.setattr(trainer_access, "build_flow_trainer", recording_build)
    monkeypatch.setattr(RunSpec, "experiment_settings", recording_experiment_settings)
    state = train_experiment(**_gi_params(tmp_path, "gi-secret").flow_parameters(), return_state=True)
    assert state.is_completed(), state.message

    assert [s.openai_api_key.get_secret_value() for s in built] == [secret_block]
    assert child_settings  # the RL blocks opened the run from a RunSpec
    for spec_json, settings in child_settings:
        assert secret_block not in spec_json
        assert settings.openai_api_key.get_secret_value() == secret_block  # read again by the child

    from prefect.logging.handlers import APILogHandler

    APILogHandler().flush()  # logs go to the API in background batches: send them now
    root = state.state_details.flow_run_id
    with get_client(sync_client=True) as client:
        children = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[root])))
        runs = [client.read_flow_run(root)] + [client.read_flow_run(c.id) for c in children]
        logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[r.id for r in runs])))
        artifacts = client.read_artifacts()
    assert len(runs) >= 3 and any("spec" in r.parameters for r in runs)  # parent + one run per block
    for r in runs:
        assert secret_block not in json.dumps(r.parameters, default=str), r.name
    # (Whether any log arrived depends on the session's log level; none may hold the key.)
    assert all(secret_block not in entry.message for entry in logs)
    assert all(secret_block not in json.dumps(a.model_dump(mode="json")) for a in artifacts)
    for path in (tmp_path / "runs").rglob("*"):
        if path.is_file():
            assert secret_block.encode() not in path.read_bytes(), path


def test_missing_block_means_no_key(prefect_server, monkeypatch, tmp_path):
    from flows.secret_blocks import openai_api_key

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert openai_api_key() is None
    params = _gi_params(tmp_path, "gi-nokey")
    assert params.run_spec().experiment_settings().openai_api_key is None


def test_unreachable_block_is_logged_without_the_value(prefect_server, monkeypatch, caplog):
    from prefect.blocks.system import Secret

    from flows.secret_blocks import openai_api_key

    def failing_load(*args, **kwargs):
        raise RuntimeError(f"boom near {BLOCK_KEY}")

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setattr(Secret, "load", failing_load)
    with caplog.at_level(logging.WARNING, logger="flows.secret_blocks"):
        assert openai_api_key() is None
    messages = [r.getMessage() for r in caplog.records if r.name == "flows.secret_blocks"]
    assert messages and OPENAI_SECRET_BLOCK in messages[0] and "RuntimeError" in messages[0]
    assert all(BLOCK_KEY not in m for m in messages)


def test_without_a_prefect_api_no_block_is_read(monkeypatch):
    """Outside a flow run and with no API configured, no temporary server is started."""
    from prefect.blocks.system import Secret
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.secret_blocks import openai_api_key

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setattr(Secret, "load", lambda *a, **k: pytest.fail("Secret block read without an API"))
    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        assert not PREFECT_API_URL.value()
        assert openai_api_key() is None


# -- (c) the environment wins -----------------------------------------------------------------------


def test_environment_key_wins_over_the_block(secret_block, monkeypatch, tmp_path):
    from flows.secret_blocks import openai_api_key

    monkeypatch.setenv("OPENAI_API_KEY", ENV_KEY)
    assert openai_api_key().get_secret_value() == ENV_KEY
    params = _gi_params(tmp_path, "gi-env")
    assert params.settings(params.hyper_params()).openai_api_key is None  # the form never holds one
    spec = params.run_spec()
    assert ENV_KEY not in spec.model_dump_json() and "openai_api_key" not in spec.settings
    assert spec.experiment_settings().openai_api_key.get_secret_value() == ENV_KEY
    monkeypatch.delenv("OPENAI_API_KEY")
    assert spec.experiment_settings().openai_api_key.get_secret_value() == secret_block

"""Fields of the original library that nipflow does not implement are refused (issue #18, point 3).

They stay in the models at their defaults, so the original library's parameter files (which
list every field) still load; any other value is a ``ValidationError`` naming the field.
``test_every_field_used.py`` reads the ``REFUSALS`` table below: every field declared with
``unsupported_field`` must have a row here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from nip_core.parameters import (
    CodeValidationAgentParameters,
    GraphIsomorphismAgentParameters,
    HyperParameters,
    ParameterError,
)
from nip_core.parameters.base import UNSUPPORTED_KEY, dotted_path, unsupported_reason
from nip_core.parameters.describe import describe_lines
from nip_core.parameters.partial import partial_model

ROOT = Path(__file__).resolve().parents[3]
GI = {"scenario": "graph_isomorphism", "trainer": "vanilla_ppo", "dataset": "easy"}
CV = {"scenario": "code_validation", "trainer": "pure_text_ei", "dataset": "nipflow-cv"}

#: (field path, a non-default value, scenario) for every refused field
REFUSALS = [
    ("functionalize_modules", True, "graph_isomorphism"),
    ("include_linear_message_space", True, "graph_isomorphism"),
    ("d_linear_message_space", 4, "graph_isomorphism"),
    ("agents.prover.use_manual_architecture", True, "graph_isomorphism"),
    ("agents.verifier.normalize_message_history", True, "graph_isomorphism"),
    ("agents.prover.load_checkpoint_and_parameters", True, "graph_isomorphism"),
    ("agents.prover.checkpoint_run_id", "run-17", "graph_isomorphism"),
    ("agents.verifier.checkpoint_version", "v3", "code_validation"),
    ("agents.verifier.d_linear_message_selector", 8, "graph_isomorphism"),
    ("agents.verifier.num_linear_message_selector_layers", 3, "graph_isomorphism"),
    ("agents.prover.use_dummy_api", True, "code_validation"),
    ("code_validation.apps_difficulty", "competition", "code_validation"),
    ("code_validation.apps_solution_number", 2, "code_validation"),
    ("code_validation.apps_exclude_flagged", False, "code_validation"),
    ("message_regression.enabled", True, "graph_isomorphism"),
    ("message_regression.agents", ["verifier"], "graph_isomorphism"),
    ("message_regression.regression_method", "cnn", "graph_isomorphism"),
    ("message_regression.test_size", 0.5, "graph_isomorphism"),
    ("message_regression.reset_on_fit", False, "graph_isomorphism"),
    ("message_regression.mlp_num_layers", 3, "graph_isomorphism"),
    ("message_regression.mlp_hidden_size", 32, "graph_isomorphism"),
    ("message_regression.mlp_activation", "tanh", "graph_isomorphism"),
    ("message_regression.mlp_num_epochs", 5, "graph_isomorphism"),
    ("message_regression.mlp_batch_size", 64, "graph_isomorphism"),
    ("message_regression.mlp_learning_rate", 0.01, "graph_isomorphism"),
    ("base_run.rerun_tests_force_test_during_training_state", False, "code_validation"),
]


def base(scenario: str) -> dict[str, Any]:
    return dict(GI if scenario == "graph_isomorphism" else CV)


def nested(path: str, value: Any) -> dict[str, Any]:
    """``{"a": {"b": value}}`` for ``"a.b"``."""
    *parents, leaf = path.split(".")
    data: dict[str, Any] = {leaf: value}
    for part in reversed(parents):
        data = {part: data}
    return data


def merged(scenario: str, path: str, value: Any) -> dict[str, Any]:
    return {**base(scenario), **nested(path, value)}


@pytest.mark.parametrize("path, value, scenario", REFUSALS, ids=[row[0] for row in REFUSALS])
def test_a_non_default_value_is_refused_naming_the_field(path, value, scenario):
    with pytest.raises(ValidationError) as caught:
        HyperParameters.model_validate(merged(scenario, path, value))
    errors = caught.value.errors(include_url=False)
    assert len(errors) == 1
    assert errors[0]["type"] == "unsupported_parameter"
    assert dotted_path(tuple(errors[0]["loc"])) == path
    field = path.rsplit(".", 1)[-1]
    assert errors[0]["msg"].startswith(f"{field}={value!r} is not supported by nipflow")
    # The user-facing error (files, --set, forms) names the whole dotted path.
    with pytest.raises(ParameterError) as user_error:
        HyperParameters.from_dict(merged(scenario, path, value), source="p.json")
    assert f"in p.json: {path}: {field}={value!r} is not supported by nipflow" in str(user_error.value)


@pytest.mark.parametrize("path, value, scenario", REFUSALS, ids=[row[0] for row in REFUSALS])
def test_the_default_written_out_is_accepted(path, value, scenario):
    """A parameter file of the original library lists every field at its default: it loads."""
    default = HyperParameters.model_validate(base(scenario))
    key = "agents._default." + path.split(".", 2)[2] if path.startswith("agents.") else path
    written = HyperParameters.model_validate(merged(scenario, key, default.get(key)))
    assert written == default


def test_the_whole_default_tree_written_out_loads_unchanged():
    for scenario in ("graph_isomorphism", "code_validation"):
        hp = HyperParameters.model_validate(base(scenario))
        assert HyperParameters.from_dict(json.loads(hp.to_json())) == hp


def test_built_parameters_are_immutable():
    # HyperParameters.from_dict shares one object per parameter set in a process: nothing may
    # change it in place (a different set is a new object, e.g. model_copy or from_dict).
    hp = HyperParameters.model_validate(GI)
    with pytest.raises(ValidationError, match="Instance is frozen"):
        hp.functionalize_modules = True
    with pytest.raises(ValidationError, match="Instance is frozen"):
        hp.message_regression.mlp_num_epochs = 3
    assert hp.functionalize_modules is False and hp.message_regression.mlp_num_epochs == 10


def test_a_random_agent_refuses_the_common_fields_as_well():
    with pytest.raises(ParameterError, match=r"agents\.prover\.use_manual_architecture: use_manual_architecture"):
        HyperParameters.from_dict({**GI, "agents": {"prover": {"is_random": True, "use_manual_architecture": True}}})


def test_several_refusals_are_listed_together():
    data = {**GI, "functionalize_modules": True, "message_regression": {"enabled": True},
            "agents": {"verifier": {"d_linear_message_selector": 4}}}
    with pytest.raises(ParameterError) as caught:
        HyperParameters.from_dict(data)
    assert [p for p, _ in caught.value.problems] == [
        "functionalize_modules", "agents.verifier.d_linear_message_selector", "message_regression.enabled"]


def test_model_provider_admits_only_openai():
    """``model_provider`` is not refused as unsupported: its type has one value, the API nipflow talks to."""
    assert HyperParameters.from_dict({**CV, "agents": {"prover": {"model_provider": "OpenAI"}}}) \
        .agent_params("prover").model_provider == "OpenAI"
    with pytest.raises(ParameterError, match=r"agents\.prover\.model_provider: Input should be 'OpenAI'"):
        HyperParameters.from_dict({**CV, "agents": {"prover": {"model_provider": "Anthropic"}}})


def test_refused_fields_say_so_in_their_description_schema_and_listing():
    rows = {path: None for path, _, _ in REFUSALS}
    hp_gi, hp_cv = HyperParameters.model_validate(GI), HyperParameters.model_validate(CV)
    lines = {line.split(":", 1)[0]: line for hp in (hp_gi, hp_cv) for line in describe_lines(hp)}
    for path in rows:
        key = "agents._default." + path.split(".", 2)[2] if path.startswith("agents.") else path
        assert "  # " in lines[key] and "Not supported by nipflow: " in lines[key], key
    schema = HyperParameters.model_json_schema()
    mr = schema["$defs"]["MessageRegressionParameters"]["properties"]["enabled"]
    assert mr[UNSUPPORTED_KEY] == "message regression is not implemented."
    assert mr["description"].endswith("Not supported by nipflow: message regression is not implemented.")
    # the Prefect form of train_experiment is the partial model: it shows the same description
    form = partial_model(HyperParameters).model_json_schema()
    assert "Not supported by nipflow" in form["properties"]["functionalize_modules"]["description"]


def test_the_supported_fields_carry_no_refusal_marker():
    refused = {path.rsplit(".", 1)[-1] for path, _, _ in REFUSALS}
    for model in (GraphIsomorphismAgentParameters, CodeValidationAgentParameters):
        for name, info in model.model_fields.items():
            assert (unsupported_reason(info) is not None) == (name in refused), name


def test_test_params_and_the_shipped_configs_still_validate():
    assert GraphIsomorphismAgentParameters.construct_test_params().d_linear_message_selector == 16
    assert CodeValidationAgentParameters.construct_test_params() == CodeValidationAgentParameters()
    configs = sorted((ROOT / "configs").glob("*.json"))
    assert len(configs) >= 3
    for file in configs:
        hp = HyperParameters.from_dict(json.loads(file.read_text()), source=str(file))
        assert hp.scenario == ("code_validation" if file.name.startswith("cv_") else "graph_isomorphism"), file

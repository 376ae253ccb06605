"""The typed form of ``train_experiment``: dropdowns from the registries, knobs, nested params."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from flows.parameters import ExperimentParameters
from nip_core.parameters import ParameterError

GI = dict(scenario="graph_isomorphism", trainer="vanilla_ppo")
CV = dict(scenario="code_validation", trainer="pure_text_ei")


def _schema():
    from prefect.utilities.callables import parameter_schema

    from flows.experiment import train_experiment

    return parameter_schema(train_experiment.fn).model_dump_for_openapi()


def _enum(schema, field):
    prop = schema["properties"][field]
    (choice,) = [s for s in prop["anyOf"] if s.get("type") != "null"]
    return choice["enum"]


def test_the_dropdowns_list_exactly_the_registries():
    from nip_core.protocols import PROTOCOL_HANDLER_REGISTRY
    from nip_core.scenarios.code_validation.dataset import dataset_names
    from nip_core.scenarios.graph_isomorphism.named_datasets import NAMED_DATASETS
    from nip_core.parameters.trainer_specs import registered_trainer_names

    schema = _schema()
    assert _enum(schema, "scenario") == ["graph_isomorphism", "code_validation"]
    assert _enum(schema, "trainer") == registered_trainer_names() == [
        "pure_text_ei", "pure_text_malt", "reinforce", "solo_agent", "spg", "vanilla_ppo"]
    assert sorted(_enum(schema, "protocol")) == sorted({name for name, _ in PROTOCOL_HANDLER_REGISTRY}) == [
        "adp", "debate", "merlin_arthur", "mnip", "multi_channel_test", "nip", "solo_verifier"]
    assert sorted(_enum(schema, "dataset")) == sorted(set(NAMED_DATASETS) | set(dataset_names()))


def test_params_is_a_typed_nested_form_with_descriptions():
    schema = _schema()
    defs = schema["definitions"]
    params = schema["properties"]["params"]
    assert params["anyOf"][0]["$ref"] == "#/definitions/HyperParametersPartial"
    rl = defs["RlTrainerParametersPartial"]["properties"]
    assert rl["num_iterations"]["anyOf"][0] == {"minimum": 0, "type": "integer"}
    assert rl["num_iterations"]["default"] is None and rl["num_iterations"]["description"]
    loss = rl["loss_critic_type"]["anyOf"][0]
    assert loss["enum"] == ["smooth_l1", "l1", "l2"]
    # every $ref resolves
    import json
    import re

    refs = set(re.findall(r'"#/definitions/([^"]+)"', json.dumps(schema)))
    assert refs <= set(defs)


def test_deployment_defaults_conform_to_the_schema():
    from pathlib import Path

    import yaml
    from prefect.utilities.schema_tools.validation import validate

    schema = _schema()
    spec = yaml.safe_load((Path(__file__).parents[2] / "deployments" / "prefect.yaml").read_text())
    checked = 0
    for d in spec["deployments"]:
        if d["entrypoint"] == "flows.experiment.train_experiment" and d.get("parameters"):
            assert validate(d["parameters"], schema, raise_on_error=False, preprocess=True,
                            ignore_required=True) == []
            checked += 1
    assert checked == 2
    nested = {"trainer": "spg", "num_iterations": 3,
              "params": {"rl": {"lr": 0.01}, "agents": {"prover": {"kind": "random"}}}}
    assert validate(nested, schema, raise_on_error=False, preprocess=True, ignore_required=True) == []
    bad = {"trainer": "no_such_trainer", "params": {"rl": {"num_iterations": -1}}}
    assert len(validate(bad, schema, raise_on_error=False, preprocess=True, ignore_required=True)) >= 2
    assert validate({"num_iterations": -1}, schema, raise_on_error=False, preprocess=True,
                    ignore_required=True) != []


@pytest.mark.parametrize("trainer,kind_field", [("vanilla_ppo", "rl.num_iterations"),
                                                ("spg", "rl.num_iterations"),
                                                ("solo_agent", "solo_agent.num_epochs"),
                                                ("pure_text_ei", "rl.num_iterations"),
                                                ("pure_text_malt", "rl.num_iterations")])
def test_num_iterations_maps_to_the_trainers_field(trainer, kind_field):
    scenario = "code_validation" if trainer.startswith("pure_text") else "graph_isomorphism"
    hp = ExperimentParameters(scenario=scenario, trainer=trainer, num_iterations=3).hyper_params()
    assert hp.get(kind_field) == 3


def test_the_other_knobs_map_to_their_fields():
    hp = ExperimentParameters(**GI, seed=11, frames_per_batch=64).hyper_params()
    assert (hp.seed, hp.rl.frames_per_batch, hp.rl.rollouts_per_iteration) == (11, 64, None)
    hp = ExperimentParameters(**CV, rollouts_per_iteration=5, seed=2).hyper_params()
    assert (hp.rl.rollouts_per_iteration, hp.seed) == (5, 2)


def test_model_knobs_set_every_agent_of_the_role_keeping_the_default_entry():
    hp = ExperimentParameters(**CV, protocol="debate", prover_model="p-model", verifier_model="v-model",
                              params={"agents": {"_default": {"freeze_agent": True, "temperature": 0.5}}}
                              ).hyper_params()
    assert [hp.agent_params(a).model_name for a in ("prover0", "prover1", "verifier")] == [
        "p-model", "p-model", "v-model"]
    assert all(hp.agent_params(a).freeze_agent and hp.agent_params(a).temperature == 0.5
               for a in ("prover0", "prover1", "verifier"))
    assert hp.agent_params("_default").model_name == "gpt-4o-mini-2024-07-18"


@pytest.mark.parametrize("fields,named", [
    (dict(**CV, frames_per_batch=100), "parameters.frames_per_batch"),
    (dict(**GI, rollouts_per_iteration=4), "parameters.rollouts_per_iteration"),
    (dict(**GI, prover_model="m"), "parameters.prover_model"),
    (dict(**CV, protocol="solo_verifier", prover_model="m"), "parameters.prover_model"),
    (dict(**CV, block_size=3), "parameters.block_size"),
    (dict(**CV, dataset="small"), "parameters.dataset"),
    (dict(**GI, dataset="nipflow-cv"), "parameters.dataset"),
])
def test_a_knob_that_does_not_apply_is_refused_naming_it(fields, named):
    with pytest.raises(ParameterError) as info:
        ExperimentParameters(**fields).hyper_params()
    assert [path for path, _ in info.value.problems] == [named]


def test_a_dataset_of_the_wrong_scenario_lists_the_valid_ones():
    with pytest.raises(ParameterError, match=r"parameters.dataset: 'small' is not a code_validation dataset "
                                             r"\(valid: nipflow-cv, test\)"):
        ExperimentParameters(**CV, dataset="small").hyper_params()
    assert ExperimentParameters(**CV, dataset="test").hyper_params().dataset == "test"
    assert ExperimentParameters(**GI, dataset="test").hyper_params().dataset == "test"


def test_params_as_a_nested_typed_object_and_as_a_legacy_dict():
    from flows.form_fields import PartialHyperParameters

    typed = ExperimentParameters(**GI, params=PartialHyperParameters(rl={"num_iterations": 7}, seed=5))
    legacy = ExperimentParameters.model_validate({**GI, "params": {"rl": {"num_iterations": 7}, "seed": 5}})
    assert typed.hyper_params() == legacy.hyper_params()
    assert legacy.hyper_params().rl.num_iterations == 7 and legacy.hyper_params().rl.lr == 0.003
    assert legacy.model_dump(mode="json")["params"] == {"rl": {"num_iterations": 7}, "seed": 5}
    with pytest.raises(ValidationError, match=r"params\.rl\.num_iterations"):
        ExperimentParameters(**GI, params={"rl": {"num_iterations": "many"}})
    with pytest.raises(ValidationError, match=r"params\.rl\.no_such_field"):
        ExperimentParameters(**GI, params={"rl": {"no_such_field": 1}})


def test_a_full_tree_round_trips_exactly_through_params():
    from nip_core.experiment import make_params

    full = make_params("code_validation", "pure_text_malt", protocol="debate",
                       overrides=["rl.frames_per_batch=null", "agents.prover0.is_random=true"])
    again = ExperimentParameters(params=full.to_dict()).hyper_params()
    assert again == full and again.params_hash() == full.params_hash()
    assert again.rl.frames_per_batch is None and again.agent_params("prover0").is_random


def test_null_fields_of_a_form_mean_not_given():
    p = ExperimentParameters(**GI, params={"rl": {"num_iterations": None, "frames_per_batch": None}, "seed": None})
    hp = p.hyper_params()
    assert (hp.rl.num_iterations, hp.seed) == (1000, 6198)
    assert hp.rl.frames_per_batch is None  # a field that accepts None keeps an explicit null


def test_precedence_params_then_knobs_then_overrides():
    base = dict(**GI, params={"seed": 1, "rl": {"num_iterations": 5, "lr": 0.1}})
    assert ExperimentParameters(**base).hyper_params().seed == 1
    hp = ExperimentParameters(**base, seed=2, num_iterations=6).hyper_params()
    assert (hp.seed, hp.rl.num_iterations, hp.rl.lr) == (2, 6, 0.1)
    hp = ExperimentParameters(**base, seed=2, num_iterations=6,
                              overrides=["seed=3", "rl.num_iterations=8"]).hyper_params()
    assert (hp.seed, hp.rl.num_iterations, hp.rl.lr) == (3, 8, 0.1)


@pytest.mark.parametrize("field,value,listed", [("trainer", "ppo_x", "'vanilla_ppo'"),
                                                ("protocol", "nipp", "'debate'"),
                                                ("dataset", "big", "'nipflow-cv'"),
                                                ("scenario", "chess", "'code_validation'")])
def test_an_invalid_choice_is_an_error_naming_the_field(field, value, listed):
    with pytest.raises(ValidationError) as info:
        ExperimentParameters(**{field: value})
    assert [e["loc"] for e in info.value.errors()] == [(field,)]
    assert listed in str(info.value)  # the valid choices are listed
    assert value not in str(info.value)  # inputs are hidden (they may hold a secret)


def test_sweep_points_keep_the_typed_fields():
    from flows.sweep import point_parameters

    base = ExperimentParameters(**GI, num_iterations=2, params={"rl": {"lr": 0.5}})
    child = point_parameters(base, "sw", 1, {"seed": 9})
    hp = child.hyper_params()
    assert (child.run_id, hp.seed, hp.rl.num_iterations, hp.rl.lr) == ("sw-001", 9, 2, 0.5)


FLOWS = ("flows.experiment:train_experiment", "flows.retrain:scheduled_retraining", "flows.sweep:sweep")


def _flow(path):
    import importlib

    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("path", FLOWS)
def test_every_field_is_a_top_level_flow_parameter_with_the_models_default_and_description(path):
    """The fields merge key by key with a deployment's defaults only if they are top-level."""
    import inspect

    from prefect.utilities.callables import parameter_schema

    flow = _flow(path)
    own = {"scheduled_retraining": {"warm_start_from"}, "sweep": {"run_id"}}.get(flow.name, set())
    signature = inspect.signature(flow.fn).parameters
    fields = ExperimentParameters.model_fields
    assert set(fields) - set(signature) == own  # only the fields the flow decides itself are missing
    properties = parameter_schema(flow).model_dump_for_openapi()["properties"]
    for name in set(fields) - own:
        model_default = fields[name].get_default(call_default_factory=True)
        default = signature[name].default
        assert default == model_default or (default is None and model_default in ([], {})) or (
            name == "params" and default is None), name
        assert properties[name]["description"] == fields[name].description, name
    assert "parameters" not in signature and "base" not in signature


def test_a_run_parameter_replaces_one_field_of_the_deployments_defaults():
    """What the server does for ``prefect deployment run ... --param run_id=x``: a shallow merge."""
    import yaml
    from pathlib import Path

    spec = yaml.safe_load((Path(__file__).parents[2] / "deployments" / "prefect.yaml").read_text())
    (gi,) = [d for d in spec["deployments"] if d["name"] == "nip-gi-ppo"]
    merged = {**gi["parameters"], "run_id": "gi-1", "num_iterations": 2}
    parameters = ExperimentParameters.from_flow_parameters(
        _flow(FLOWS[0]).validate_parameters(merged))
    hp = parameters.hyper_params()
    assert (hp.scenario, hp.trainer, hp.interaction_protocol, hp.dataset, hp.rl.num_iterations) == (
        "graph_isomorphism", "vanilla_ppo", "nip", "small", 2)
    assert (parameters.run_id, parameters.block_size) == ("gi-1", 10)


def test_flow_parameters_round_trip_and_read_the_old_nested_form():
    p = ExperimentParameters(**GI, num_iterations=3, params={"rl": {"lr": 0.01}}, overrides=["seed=4"],
                             settings_overrides={"data_dir": "d"}, run_id="r")
    as_json = p.flow_parameters(mode="json")
    assert set(as_json) == {"scenario", "trainer", "num_iterations", "params", "overrides",
                            "settings_overrides", "run_id"}
    assert ExperimentParameters.from_flow_parameters(as_json) == p
    # a run suspended by a version whose only flow parameter was ``parameters``
    assert ExperimentParameters.from_flow_parameters({"parameters": p.model_dump(mode="json")}) == p
    assert ExperimentParameters().flow_parameters() == {}


def test_a_trainer_registered_after_the_flows_were_imported_is_accepted():
    # the form lists the trainers registered at import; validation asks the registry
    from pydantic import ValidationError

    from flows.experiment import train_experiment
    from flows.parameters import ExperimentParameters
    from nip_core.trainers.registry import register_trainer, unregister_trainer
    from nip_core.trainers.vanilla_ppo import VanillaPpoTrainer

    @register_trainer("late_ppo")
    class LatePpo(VanillaPpoTrainer):
        pass

    try:
        assert ExperimentParameters(scenario="graph_isomorphism", trainer="late_ppo").trainer == "late_ppo"
        assert train_experiment.validate_parameters({"trainer": "late_ppo"})["trainer"] == "late_ppo"
    finally:
        unregister_trainer("late_ppo")
    with pytest.raises(ValidationError, match="Input should be a registered trainer: 'pure_text_ei'"):
        ExperimentParameters(scenario="graph_isomorphism", trainer="late_ppo")

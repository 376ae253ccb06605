import json
import subprocess
import sys

import pytest

from nip_core.parameters import (
    CodeValidationAgentParameters,
    GraphIsomorphismAgentParameters,
    HyperParameters,
    ParameterError,
    RandomAgentParameters,
    apply_overrides,
)

BASE = {"scenario": "graph_isomorphism", "trainer": "vanilla_ppo", "dataset": "test"}


def full_params() -> HyperParameters:
    return HyperParameters.from_dict({
        **BASE,
        "trainer": "spg",  # reads ppo's common fields and spg.* (docs/behaviour.md#b43)
        "interaction_protocol": "debate",
        "seed": 42,
        "rl": {"num_iterations": 7, "lr": 1e-4, "clip_value": 0.3},
        "ppo": {"clip_epsilon": 0.3},
        "spg": {"variant": "lola", "stackelberg_sequence": [["verifier"], ["prover0", "prover1"]]},
        "debate_protocol": {"sequential": True, "max_message_rounds": 9},
        "protocol_common": {"zero_knowledge": True, "force_guess": "y"},
        "agents": {
            "verifier": {"num_gnn_layers": 2, "agent_lr_factor": {"actor": 0.5, "critic": 2.0},
                         "update_schedule": {"kind": "contiguous_periodic", "period": 4, "start": 1, "stop": 3}},
            "prover0": {"is_random": True},
        },
    })


def test_defaults_follow_the_original_tree():
    hp = HyperParameters(**BASE)
    assert hp.interaction_protocol == "nip"
    assert hp.seed == 6198
    assert hp.rl.frames_per_batch == 1000 and hp.rl.lr == 0.003 and hp.rl.gamma == 0.9
    assert hp.ppo.clip_epsilon == 0.2 and hp.ppo.entropy_eps == 0.001
    assert hp.spg.variant == "psos" and hp.spg.ihvp_rank == 5
    assert hp.nip_protocol.max_message_rounds == 8 and hp.nip_protocol.min_message_rounds == 1
    assert hp.protocol_common.verifier_terminated_penalty == -1.0
    assert isinstance(hp.agent_params("anyone"), GraphIsomorphismAgentParameters)
    assert hp.agent_params("anyone").num_gnn_layers == 5


def test_json_round_trip_is_exact():
    hp = full_params()
    text = json.dumps(hp.to_dict())
    again = HyperParameters.from_dict(json.loads(text))
    assert again == hp
    assert again.to_dict() == hp.to_dict()
    assert isinstance(again.agents["prover0"], RandomAgentParameters)
    assert again.agent_params("verifier").update_schedule.is_active(1)
    assert not again.agent_params("verifier").update_schedule.is_active(3)
    assert again.rl.clip_value == 0.3


def test_params_hash_is_stable_across_processes():
    hp = full_params()
    code = (
        "import json,sys; from nip_core.parameters import HyperParameters;"
        "print(HyperParameters.from_dict(json.loads(sys.stdin.read())).params_hash())"
    )
    out = subprocess.run([sys.executable, "-c", code], input=json.dumps(hp.to_dict()),
                         capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "123", "PATH": "/usr/bin:/bin"})
    assert out.stdout.strip() == hp.params_hash()
    changed = hp.model_copy(update={"seed": 43})
    assert changed.params_hash() != hp.params_hash()


def test_pinned_hash_value():
    # Pins the canonical serialisation: a change here changes every run's identity.
    hp = HyperParameters(**BASE)
    assert len(hp.params_hash()) == 16
    assert hp.params_hash() == HyperParameters.from_dict(json.loads(hp.to_json())).params_hash()


def test_a_field_added_since_runs_were_stored_keeps_their_hash_acceptable():
    import hashlib

    from nip_core.parameters.hyper_parameters import FIELDS_ADDED_SINCE_STORED_RUNS
    from nip_core.parameters.hyper_parameters import canonical_json

    hp = HyperParameters(**BASE)
    older = hp.to_dict()
    for path, value in FIELDS_ADDED_SINCE_STORED_RUNS:
        group, leaf = path.split(".")
        assert older[group].pop(leaf) == value  # the default is what older runs had
    older_hash = hashlib.sha256(canonical_json(older).encode()).hexdigest()[:16]
    assert older_hash != hp.params_hash() and hp.accepted_params_hashes() == {hp.params_hash(), older_hash}
    # a run that sets the new field away from the old behaviour has no older hash
    tuned = HyperParameters(scenario="code_validation", trainer="pure_text_ei", dataset="test",
                            text_rl={"fine_tune_n_epochs": 2})
    assert tuned.accepted_params_hashes() == {tuned.params_hash()}


@pytest.mark.parametrize("data, path", [
    ({**BASE, "rl": {"lr": "fast"}}, "rl.lr"),
    ({**BASE, "rl": {"num_iterationz": 3}}, "rl.num_iterationz"),
    ({**BASE, "agents": {"verifier": {"gnn_lr_factor": {"actor": "x"}}}}, "agents.verifier.gnn_lr_factor.actor"),
    ({**BASE, "agents": {"verifier": {"update_schedule": {"kind": "contiguous_periodic", "period": 0, "stop": 1}}}},
     "agents.verifier.update_schedule"),
    ({**BASE, "nip_protocol": {"min_message_rounds": 9}}, "nip_protocol"),
    ({**BASE, "interaction_protocol": "chess"}, "interaction_protocol"),
    ({**BASE, "unknown_top": 1}, "unknown_top"),
])
def test_errors_name_the_dotted_path(data, path):
    with pytest.raises(ParameterError) as info:
        HyperParameters.from_dict(data, source="exp.json")
    assert any(p == path or p.startswith(path + ".") for p, _ in info.value.problems), info.value.problems
    assert "exp.json" in str(info.value)


def test_unknown_key_is_reported_as_unknown_parameter():
    with pytest.raises(ParameterError) as info:
        HyperParameters.from_dict({**BASE, "ppo": {"clip": 0.1}})
    assert ("ppo.clip", "unknown parameter") in info.value.problems


def test_trainer_must_fit_scenario():
    with pytest.raises(ParameterError, match="cannot train scenario"):
        HyperParameters.from_dict({**BASE, "trainer": "pure_text_ei"})


def test_code_validation_agents_get_their_own_class():
    hp = HyperParameters.from_dict({"scenario": "code_validation", "trainer": "pure_text_ei", "dataset": "test",
                                    "agents": {"verifier": {"model_name": "gpt-4o-mini"}}})
    assert isinstance(hp.agents["verifier"], CodeValidationAgentParameters)
    assert hp.agent_params("prover").model_name == "gpt-4o-mini-2024-07-18"


def test_agent_kind_must_match_scenario():
    with pytest.raises(ParameterError, match="agents.verifier"):
        HyperParameters.from_dict({**BASE, "agents": {"verifier": {"kind": "code_validation"}}})


def test_dotted_overrides_validate_the_same_way():
    data = apply_overrides({**BASE, "trainer": "spg"}, ["rl.num_iterations=50", "agents.verifier.d_gnn=8",
                                  "protocol_common.force_guess=zero", "spg.stackelberg_sequence=[[\"verifier\"]]"])
    hp = HyperParameters.from_dict(data)
    assert hp.rl.num_iterations == 50
    assert hp.agent_params("verifier").d_gnn == 8
    assert hp.protocol_common.force_guess == "zero"
    assert hp.spg.stackelberg_sequence == [["verifier"]]
    with pytest.raises(ParameterError) as info:
        HyperParameters.from_dict(apply_overrides(BASE, ["rl.num_iterations=-1"]))
    assert info.value.problems[0][0] == "rl.num_iterations"
    with pytest.raises(ParameterError, match="rl.lr"):
        apply_overrides({**BASE, "rl": {"lr": 0.1}}, ["rl.lr.x=1"])
    with pytest.raises(ParameterError):
        apply_overrides(BASE, ["no_equals_sign"])


def test_get_dotted_lookup():
    hp = full_params()
    assert hp.get("rl.num_iterations") == 7
    assert hp.get("agents.verifier.num_gnn_layers") == 2
    with pytest.raises(KeyError):
        hp.get("rl.nope")

"""The trainer registry is the one place a trainer is declared (issue #18, point 4)."""

from __future__ import annotations

import pytest

from nip_core.parameters import HyperParameters, ParameterError
from nip_core.trainers.base import Trainer
from nip_core.parameters.trainer_specs import (
    UnknownTrainerError,
    registered_trainer_names,
    trainer_kind,
    trainer_uses_critic,
)
from nip_core.trainers.registry import (
    TRAINER_REGISTRY,
    TrainerRegistrationError,
    get_trainer_class,
    register_trainer,
    unregister_trainer,
)
from nip_core.trainers.tensordict_rl import TensorDictRlTrainer
from nip_core.trainers.vanilla_ppo import VanillaPpoTrainer
from tests.nip_core.trainers.gi_helpers import settings_for, tiny_params, tiny_scenario

BUILT_INS = ["pure_text_ei", "pure_text_malt", "reinforce", "solo_agent", "spg", "vanilla_ppo"]


@pytest.fixture
def registered():
    """Names registered by a test, removed again afterwards."""
    names: list[str] = []
    yield names
    for name in names:
        unregister_trainer(name)


def test_built_in_trainers_declare_kind_and_critic():
    assert registered_trainer_names() == BUILT_INS
    assert {n: trainer_kind(n) for n in BUILT_INS} == {
        "pure_text_ei": "pure_text", "pure_text_malt": "pure_text", "reinforce": "tensordict",
        "solo_agent": "solo", "spg": "tensordict", "vanilla_ppo": "tensordict"}
    base = {"scenario": "graph_isomorphism", "dataset": "t"}
    uses = {n: trainer_uses_critic(HyperParameters.from_dict({**base, "trainer": n}))
            for n in ("reinforce", "solo_agent", "spg", "vanilla_ppo")}
    assert uses == {"reinforce": False, "solo_agent": False, "spg": True, "vanilla_ppo": True}
    with_critic = HyperParameters.from_dict({**base, "trainer": "reinforce",
                                             "reinforce": {"use_advantage_and_critic": True}})
    assert trainer_uses_critic(with_critic) is True


def test_a_new_actor_critic_trainer_is_accepted_and_built_with_value_heads(tmp_path, registered):
    @register_trainer("my_ac_ppo")
    class MyActorCritic(VanillaPpoTrainer):
        needs_critic = True

    @register_trainer("my_actor_only")
    class MyActorOnly(VanillaPpoTrainer):
        needs_critic = False

    registered += ["my_ac_ppo", "my_actor_only"]
    assert "my_ac_ppo" in registered_trainer_names()
    assert "my_ac_ppo" in HyperParameters.model_json_schema()["properties"]["trainer"]["enum"]
    assert get_trainer_class("my_ac_ppo") is MyActorCritic and MyActorCritic.trainer_name == "my_ac_ppo"

    for name, critic in (("my_ac_ppo", True), ("my_actor_only", False)):
        hp = tiny_params(name)
        assert HyperParameters.from_dict(hp.to_dict()).trainer == name
        settings = settings_for(tmp_path / name, run_id="r")
        instance = tiny_scenario(hp, settings)
        agents = instance.extras["combined_agents"]
        assert instance.extras["use_critic"] is critic
        assert sorted(agents.value_head) == (["prover", "verifier"] if critic else [])
        assert (instance.combined_value_head is agents) is critic
        trainer = TRAINER_REGISTRY[name](hp, settings=settings, scenario_instance=instance)
        assert trainer.use_critic is critic


def test_unknown_trainer_names_the_field_and_lists_the_registered_ones():
    with pytest.raises(ParameterError) as info:
        HyperParameters.from_dict({"scenario": "graph_isomorphism", "trainer": "ppo2", "dataset": "t"})
    [(field, message)] = info.value.problems
    assert field == "trainer"
    assert "'ppo2'" in message and ", ".join(BUILT_INS) in message
    with pytest.raises(UnknownTrainerError, match="'ppo2'.*vanilla_ppo"):
        get_trainer_class("ppo2")


def test_kind_decides_the_scenario(registered):
    @register_trainer("my_text")
    class MyText(TensorDictRlTrainer):  # the kind, not the base class, makes it a text trainer
        trainer_kind = "pure_text"
        needs_critic = False

    registered.append("my_text")
    hp = HyperParameters.from_dict({"scenario": "code_validation", "trainer": "my_text", "dataset": "t"})
    assert hp.is_text_scenario
    with pytest.raises(ParameterError, match="cannot train scenario 'graph_isomorphism'"):
        HyperParameters.from_dict({"scenario": "graph_isomorphism", "trainer": "my_text", "dataset": "t"})


@pytest.mark.parametrize("attributes, message", [
    ({"trainer_kind": "tensordict"}, "must declare needs_critic"),
    ({"needs_critic": True}, "must declare trainer_kind"),
    ({"trainer_kind": "rl", "needs_critic": True}, "got 'rl'"),
    ({"trainer_kind": "tensordict", "needs_critic": 1}, "needs_critic: bool"),
    ({"trainer_kind": "tensordict", "needs_critic": False, "critic_switch": "reinforce.nope"}, "not a hyper-parameter"),
    ({"trainer_kind": "tensordict", "needs_critic": False, "critic_switch": "rl.gamma"}, "not a boolean"),
])
def test_missing_or_invalid_declarations_are_refused_naming_the_class(attributes, message):
    # on a base that declares nothing (TensorDictRlTrainer and PureTextRlTrainer declare both)
    cls = type("Undeclared", (Trainer,), dict(attributes))
    with pytest.raises(TrainerRegistrationError, match=message) as info:
        register_trainer("undeclared")(cls)
    assert "Undeclared" in str(info.value)
    assert "undeclared" not in registered_trainer_names() and "undeclared" not in TRAINER_REGISTRY


def test_a_name_is_registered_once(registered):
    class Other(VanillaPpoTrainer):
        pass

    with pytest.raises(ValueError, match="'vanilla_ppo' is already registered by .*VanillaPpoTrainer"):
        register_trainer("vanilla_ppo")(Other)
    with pytest.raises(ValueError, match="identifier"):
        register_trainer("not a name")
    assert get_trainer_class("vanilla_ppo") is VanillaPpoTrainer


def test_a_guide_style_registration_needs_only_the_decorator(registered):
    # nip's guide registers a trainer with the decorator alone; kind and critic come from the base
    from nip_core.trainers.pure_text_base import PureTextRlTrainer

    @register_trainer("guide_td")
    class GuideTensorDict(TensorDictRlTrainer):
        def _get_loss_module_and_gae(self):
            raise NotImplementedError

    @register_trainer("guide_text")
    class GuideText(PureTextRlTrainer):
        pass

    # the guide's other TensorDict base (a custom loop): nip's trainer_type says what it trains
    from nip_core.trainers.tensordict_base import TensorDictTrainer

    @register_trainer("guide_loop")
    class GuideLoop(TensorDictTrainer):
        def train(self):
            raise NotImplementedError

    @register_trainer("guide_solo")
    class GuideSolo(TensorDictTrainer):
        trainer_type = "solo_agent"

    registered += ["guide_td", "guide_text", "guide_loop", "guide_solo"]
    assert [trainer_kind(n) for n in registered] == ["tensordict", "pure_text", "tensordict", "solo"]
    base = {"scenario": "graph_isomorphism", "dataset": "t"}
    assert [trainer_uses_critic(HyperParameters.from_dict({**base, "trainer": n}))
            for n in ("guide_td", "guide_loop", "guide_solo")] == [True, True, False]


def test_each_built_in_module_registers_what_the_catalogue_states():
    """The names are answered for a built-in trainer from ``BUILT_IN_TRAINERS`` until it is imported."""
    import nip_core.trainers.catalogue  # noqa: F401  (imports, and so registers, every built-in)
    from nip_core.parameters.trainer_specs import _SPECS, BUILT_IN_TRAINERS

    assert sorted(BUILT_IN_TRAINERS) == BUILT_INS
    for name, stated in BUILT_IN_TRAINERS.items():
        spec = _SPECS[name]
        assert (spec.kind, spec.needs_critic, spec.critic_switch) == (stated.kind, stated.needs_critic,
                                                                        stated.critic_switch), name
        assert spec.class_name.startswith(stated.module + "."), name


VALIDATE_WITHOUT_TORCH = """
import json, sys
from flows.cli import main
try:
    main(["params", "validate", sys.argv[1]])
except SystemExit as e:
    code = e.code
else:
    code = 0
print("RESULT " + json.dumps({"code": code, "torch": "torch" in sys.modules,
                              "trainers": sorted(m for m in sys.modules if m.startswith("nip_core.trainers."))}))
"""


@pytest.mark.parametrize("trainer", ["vanilla_ppo", "pure_text_ei"])
def test_params_validate_imports_neither_torch_nor_a_trainer(tmp_path, trainer):
    import json
    import subprocess
    import sys
    from pathlib import Path

    scenario = "code_validation" if trainer.startswith("pure_text") else "graph_isomorphism"
    path = tmp_path / "params.json"
    path.write_text(json.dumps({"scenario": scenario, "trainer": trainer, "dataset": "test"}))
    repo = Path(__file__).resolve().parents[3]
    done = subprocess.run([sys.executable, "-c", VALIDATE_WITHOUT_TORCH, str(path)], cwd=repo,
                          capture_output=True, text=True, timeout=120)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, done.stdout + done.stderr
    result = json.loads(lines[-1][len("RESULT "):])
    assert result["code"] in (0, None) and "valid" in done.stdout, done.stdout + done.stderr
    assert result["torch"] is False
    from nip_core.parameters.trainer_specs import BUILT_IN_TRAINERS

    # the names are answered below the parameters: no trainer class, base, catalogue, not even the registry
    heavy = {t.module for t in BUILT_IN_TRAINERS.values()} | {f"nip_core.trainers.{m}" for m in (
        "base", "tensordict_base", "tensordict_rl", "pure_text_base", "catalogue", "registry")}
    assert not heavy & set(result["trainers"]), result["trainers"]

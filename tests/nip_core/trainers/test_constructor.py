"""Trainers are built as nip's guide builds them: ``Trainer(hyper_params, scenario_instance, settings)``.

Both kinds keep the scenario as ``self.scenario_instance``; the collaborators nipflow adds
(``run``, ``hooks``, ``stat_logger``) are keyword arguments with defaults. The order nipflow
used before (settings second) is refused with a message naming the guide's order.
"""

from __future__ import annotations

import pytest

import nip_core.trainers.catalogue  # noqa: F401
from nip_core.parameters import HyperParameters
from nip_core.scenarios.registry import build_scenario_instance
from nip_core.settings import ExperimentSettings
from nip_core.trainers.pure_text_ei import PureTextEiTrainer
from nip_core.trainers.vanilla_ppo import VanillaPpoTrainer
from tests.nip_core.trainers.gi_helpers import settings_for, tiny_params, tiny_scenario


def test_a_tensordict_trainer_takes_the_guides_positional_order(tmp_path):
    hp = tiny_params()
    settings = settings_for(tmp_path)
    instance = tiny_scenario(hp, settings)
    trainer = VanillaPpoTrainer(hp, instance, settings)
    assert trainer.scenario_instance is instance and trainer.settings.runs_dir == settings.runs_dir
    assert trainer.scenario is instance  # nipflow's shorter name for the same object
    with pytest.raises(TypeError, match=r"VanillaPpoTrainer\(hyper_params, scenario_instance, settings\)"):
        VanillaPpoTrainer(hp, settings)


def test_a_pure_text_trainer_takes_the_guides_positional_order(tmp_path):
    hp = HyperParameters(scenario="code_validation", trainer="pure_text_ei", dataset="nipflow-cv",
                         dataset_options={"max_train_size": 8, "max_test_size": 4})
    settings = ExperimentSettings(use_wandb=False, runs_dir=str(tmp_path / "runs"), show_progress=False,
                                  openai_base_url="http://127.0.0.1:9/v1")
    instance = build_scenario_instance(hp, settings)
    trainer = PureTextEiTrainer(hp, instance, settings)
    assert trainer.scenario_instance is instance and trainer.scenario_instance.train_environment.dataset is \
        instance.train_dataset
    assert (trainer.num_agents, trainer.max_message_rounds) == (2, hp.nip_protocol.max_message_rounds)
    with pytest.raises(TypeError, match=r"PureTextEiTrainer\(hyper_params, scenario_instance, settings\)"):
        PureTextEiTrainer(hp, settings)


def test_settings_and_fields_a_trainer_would_ignore_are_refused_naming_them(tmp_path):
    from nip_core.parameters import ParameterError
    from nip_core.trainers.solo_agent import SoloAgentTrainer

    # solo_agent trains in fp32 with one Adam per agent (solo_agent.*): rl.* is refused by the parameters
    for rl, field in (({"optimizer": "sgd"}, "rl.optimizer"), ({"precision": "bf16"}, "rl.precision")):
        with pytest.raises(ParameterError, match=rf"{field}: the solo_agent trainer does not read {field} \(read by "
                                                 rf"the TensorDict RL trainers\)"):
            HyperParameters.from_dict(dict(scenario="graph_isomorphism", trainer="solo_agent", dataset="test", rl=rl))
    hp = HyperParameters(scenario="code_validation", trainer="pure_text_ei", dataset="nipflow-cv")
    settings = ExperimentSettings(use_wandb=False, runs_dir=str(tmp_path / "runs"), num_rollout_workers=2)
    with pytest.raises(ParameterError, match=r"settings.num_rollout_workers: pure-text trainers sample through "
                                             r"the API.*max_concurrent_requests"):
        PureTextEiTrainer(hp, None, settings)
    assert not (tmp_path / "runs").exists()  # refused before anything was opened


@pytest.mark.parametrize("member, replacement", [
    ("_add_file_to_wandb_artifact", "log_run_artifact"),
    ("get_checkpoint_base_dir_from_run_id", "run store"),
    ("checkpoint_state_path", "run store"),
    ("PRETRAINED_MODEL_CACHE_PARAM_KEYS", "iteration-0 checkpoint"),
])
def test_members_of_nips_trainers_that_nipflow_replaces_are_refused_naming_the_replacement(member, replacement):
    # before: such an override was silently ignored (nothing in nipflow calls it)
    for base in (VanillaPpoTrainer, PureTextEiTrainer):
        with pytest.raises(TypeError, match=rf"Mine\.{member}: nipflow does not use nip's {member} \(.*{replacement}"):
            type("Mine", (base,), {member: lambda self: None})

"""nip's trainer guide as written (issue #29 item 6): trainers written from the seed texts run
unchanged, directly and under Prefect (``train_experiment``), and every hook they override is called.

The trainers are in ``guide_trainers.py`` (each method quotes the passage it follows). Each
runs for two iterations: first directly (``build_trainer(...).train()``, as nip's run script
does), then through the ``train_experiment`` flow on the session's Prefect test server. The
TensorDict trainer is also resumed (nip's ``load_and_set_state_from_checkpoint``) and used as
the base run of a rerun-tests run (``_load_state_dict_from_base_run_checkpoint``), which are the
two ways its loading hooks are reached.
"""

from __future__ import annotations

import pytest

from nip_core.runs import RunStore
from nip_core.settings import ExperimentSettings
from nip_core.trainers.build import build_trainer
from nip_core.parameters.trainer_specs import registered_trainer_names, trainer_kind, trainer_uses_critic
from nip_core.trainers.registry import unregister_trainer

pytestmark = [pytest.mark.e2e]

TD_OVERRIDES = ["rl.num_iterations=2", "rl.frames_per_batch=16", "rl.num_epochs=1", "rl.minibatch_size=8",
                "rl.num_test_iterations=1", "rl.num_normalization_steps=3", "pretrain_agents=true",
                "agents._default.num_gnn_layers=1", "agents._default.d_gnn=2", "d_representation=4"]
TEXT_OVERRIDES = ["rl.num_iterations=2", "rl.rollouts_per_iteration=12", "dataset_options.max_train_size=24",
                  "dataset_options.max_test_size=4", "nip_protocol.max_message_rounds=4", "text_rl.test_scheme=all",
                  "rl.num_test_iterations=1"]


@pytest.fixture(scope="module")
def guide():
    """The two trainers, registered while this module runs and not after (other tests list the registry)."""
    import guide_trainers  # registers both, with the guide's decorator

    if "seed_guide_td" not in registered_trainer_names():  # imported and unregistered before in this process
        guide_trainers.reregister()
    yield guide_trainers
    unregister_trainer("seed_guide_td")
    unregister_trainer("seed_guide_text")


@pytest.fixture(autouse=True)
def calls(guide):
    guide.CALLS.clear()
    yield
    guide.CALLS.clear()


def _params(scenario, trainer, overrides, **top):
    from flows.parameters import ExperimentParameters

    return ExperimentParameters(scenario=scenario, trainer=trainer, overrides=overrides, **top)


def test_registration_with_only_the_decorator_infers_kind_and_critic(guide):
    assert (trainer_kind("seed_guide_td"), trainer_kind("seed_guide_text")) == ("tensordict", "pure_text")
    hp = _params("graph_isomorphism", "seed_guide_td", TD_OVERRIDES, dataset="test").hyper_params()
    assert trainer_uses_critic(hp)


def test_the_tensordict_guide_trainer_directly_resumed_and_rerun(guide, tmp_path):
    runs = str(tmp_path / "runs")
    hp = _params("graph_isomorphism", "seed_guide_td", TD_OVERRIDES, dataset="test").hyper_params()
    settings = ExperimentSettings(use_wandb=False, runs_dir=runs, data_dir=str(tmp_path / "data"), run_id="td",
                                  show_progress=False)
    trainer = build_trainer(hp, settings)
    assert trainer.get_total_num_iterations() == 2 + 1  # the two decorated loops: 2 train + 1 test iterations
    trainer.train()
    trainer.close()
    rows = trainer.run.read_metrics()
    assert [r["kind"] for r in rows] == ["pretrain", "train", "train", "test"]
    assert [r["guide_frames"] for r in rows if r["kind"] != "pretrain"] == [16.0, 16.0, 16.0]
    assert trainer.run.read_json("checkpoints/iter_000002.json")["metadata"]["guide"] == "seed 002"
    fresh = set(guide.called("seed_guide_td"))

    resumed = build_trainer(hp, settings)  # nip's resume: the newest checkpoint through the loading hooks
    resumed.train()
    resumed.close()
    assert resumed._memory_iteration == 2 and [r["kind"] for r in resumed.run.read_metrics()][-1] == "test"

    rerun_hp = hp.model_copy(update={"base_run": hp.base_run.model_copy(
        update={"base_run_type": "rerun_tests", "run_id": "td"})})
    rerun = build_trainer(rerun_hp, settings.model_copy(update={"run_id": "td-rerun"}))
    rerun.train()
    rerun.close()
    assert [r["kind"] for r in rerun.run.read_metrics()] == ["test"]

    calls = guide.called("seed_guide_td")
    assert set(calls) == set(guide.TENSORDICT_HOOKS), sorted(set(guide.TENSORDICT_HOOKS) - set(calls))
    assert {"_load_state_dict_from_active_run_checkpoint", "_load_state_dict_from_base_run_checkpoint",
            "load_and_set_state_from_checkpoint"}.isdisjoint(fresh)  # a fresh run loads nothing
    assert calls.count("_get_replay_buffer") == calls.count("_train_on_replay_buffer") == 2


def test_the_tensordict_guide_trainer_under_prefect(guide, prefect_server, tmp_path):
    from flows.experiment import train_experiment

    params = _params("graph_isomorphism", "seed_guide_td", TD_OVERRIDES, dataset="test", run_id="td-flow",
                     runs_dir=str(tmp_path / "runs"), block_size=1)
    state = train_experiment(**params.flow_parameters(), return_state=True)
    assert state.is_completed(), state.message
    assert state.result()["iteration"] == 2
    run = RunStore(str(tmp_path / "runs")).open_run("td-flow")
    assert [r["kind"] for r in run.read_metrics()] == ["pretrain", "train", "train", "test"]
    calls = set(guide.called("seed_guide_td"))
    # a fresh run loads nothing (its blocks share the flow's trainer): only a resume or a rerun does
    loading = {"_load_state_dict_from_active_run_checkpoint", "_load_state_dict_from_base_run_checkpoint",
               "load_and_set_state_from_checkpoint"}
    assert calls == set(guide.TENSORDICT_HOOKS) - loading, sorted(set(guide.TENSORDICT_HOOKS) - loading - calls)


@pytest.fixture(scope="module")
def api_server(tmp_path_factory):
    from nipflow_llm_server.testing import local_api_server

    with local_api_server(tmp_path_factory.mktemp("api"), job_time_scale=0.02) as server:
        yield server


def _check_text_run(guide, run, server) -> None:
    rows = run.read_metrics()
    train = [r for r in rows if r["kind"] == "train"]
    assert [r["iteration"] for r in train] == [0, 1] and all(r["guide_rollouts"] == 12.0 for r in train)
    assert [r["guide_rollouts"] for r in rows if r["kind"] == "test"] == [4.0, 4.0]  # the test loop goes through it too
    jobs = [j for j in server.client().fine_tuning.jobs.list(limit=100).data
            if (j.metadata or {}).get("nipflow_run_id") == run.run_id]
    # one job per (iteration, group), named as the trainer asked; fine-tuning follows iteration 0 only
    assert sorted((j.metadata["nipflow_iteration"], j.metadata["nipflow_group"], j.user_provided_suffix)
                  for j in jobs) == [("0", "prover", "guide-0-prover"), ("0", "verifier", "guide-0-verifier")]
    assert run.read_json("models/iter_1.json")["verifier"] == next(
        j.fine_tuned_model for j in jobs if j.metadata["nipflow_group"] == "verifier")
    assert run.load_state(guide.GuideTextTrainer.State).rollouts_logged == 24  # the State subclass is kept


def test_the_pure_text_guide_trainer_directly(guide, api_server, tmp_path):
    hp = _params("code_validation", "seed_guide_text", TEXT_OVERRIDES).hyper_params()
    settings = ExperimentSettings(use_wandb=False, runs_dir=str(tmp_path / "runs"), run_id="text",
                                  openai_base_url=api_server.base_url, fine_tune_poll_interval_s=0.1,
                                  fine_tune_poll_max_interval_s=0.5, max_concurrent_requests=8, show_progress=False)
    trainer = build_trainer(hp, settings)
    trainer.train()
    trainer.close()
    _check_text_run(guide, trainer.run, api_server)
    assert set(guide.called("seed_guide_text")) == set(guide.PURE_TEXT_HOOKS)


def test_the_pure_text_guide_trainer_under_prefect(guide, prefect_server, api_server, tmp_path):
    from flows.experiment import train_experiment

    params = _params("code_validation", "seed_guide_text", TEXT_OVERRIDES, run_id="text-flow",
                     runs_dir=str(tmp_path / "runs"), wait_mode="poll",
                     settings_overrides={"openai_base_url": api_server.base_url, "fine_tune_poll_interval_s": 0.1,
                                         "fine_tune_poll_max_interval_s": 0.5, "max_concurrent_requests": 8})
    state = train_experiment(**params.flow_parameters(), return_state=True)
    assert state.is_completed(), state.message
    _check_text_run(guide, RunStore(str(tmp_path / "runs")).open_run("text-flow"), api_server)
    assert set(guide.called("seed_guide_text")) == set(guide.PURE_TEXT_HOOKS)

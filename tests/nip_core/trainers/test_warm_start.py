"""Warm starts: a new run begins with the final models of a finished run (nip_core only)."""

from __future__ import annotations

import json

import pytest
import torch

from nip_core.errors import CorruptCheckpointError
from nip_core.parameters import HyperParameters
from nip_core.runs import RunStore
from nip_core.settings import ExperimentSettings
from nip_core.trainers.build import build_trainer
from nip_core.trainers.vanilla_ppo import VanillaPpoTrainer
from nip_core.trainers.warm_start import (
    MODELS_FILE,
    WarmStartError,
    prepare_warm_start,
    warm_start_pure_text,
)
from tests.nip_core.trainers.gi_helpers import settings_for, tiny_params, tiny_scenario

import nip_core.trainers.catalogue  # noqa: F401

FIRST_ITERATIONS = 3


def make_trainer(hp, runs_dir, run_id):
    settings = settings_for(runs_dir, run_id=run_id)
    run = RunStore(str(runs_dir)).open_run(run_id, hp)
    return VanillaPpoTrainer(hp, settings=settings, run=run, scenario_instance=tiny_scenario(hp, settings))


def weights(trainer):
    return {k: v.detach().clone() for k, v in trainer.agents.state_dict().items()}


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    """A finished tiny GI vanilla_ppo run: (runs_dir, its initial weights, its final weights)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    runs_dir = tmp_path_factory.mktemp("runs")
    first = make_trainer(tiny_params(rl=dict(num_iterations=FIRST_ITERATIONS)), runs_dir, "first")
    initial = weights(first)
    first.run_iterations(0, FIRST_ITERATIONS)
    final = weights(first)
    torch.set_num_threads(previous)
    assert first.run.list_checkpoints() == [f"iter_{FIRST_ITERATIONS:06d}"]
    assert any(not torch.equal(initial[k], final[k]) for k in final)  # training changed the models
    return runs_dir, initial, final


def first_updates_capture(trainer):
    """Record the agents' weights and the optimiser state when the first iteration begins."""
    seen = {}
    inner = trainer._train_iteration

    def capture(iteration):
        if not seen:
            seen.update(iteration=iteration, memory=trainer._memory_iteration, weights=weights(trainer),
                        optimizer_state=len(trainer.optimizer.state))
        return inner(iteration)

    trainer._train_iteration = capture
    return seen


def test_warm_started_run_begins_with_the_previous_final_weights(first_run):
    runs_dir, first_initial, first_final = first_run
    store = RunStore(str(runs_dir))
    # Another seed and length: a warm start does not need the source's params hash.
    hp = tiny_params(seed=7, rl=dict(num_iterations=2))
    second = make_trainer(hp, runs_dir, "second")
    fresh_init = weights(second)
    record = prepare_warm_start(second.run, store.open_run("first"))
    assert record["checkpoint"] == "iter_000003" and record["run_id"] == "first" and record["models"] is None
    assert second.run.metadata()["warm_start_from"]["checkpoint"] == "iter_000003"

    seen = first_updates_capture(second)
    second.run_iterations(0, 2)
    assert (seen["iteration"], seen["memory"], seen["optimizer_state"]) == (0, 0, 0)  # fresh Adam, iteration 0
    for key, value in first_final.items():
        assert torch.equal(seen["weights"][key], value), key
    assert any(not torch.equal(fresh_init[k], first_final[k]) for k in first_final)
    assert second.state.iteration == 2 and second.run.list_checkpoints() == ["iter_000002"]
    source_manifest = json.loads((runs_dir / "first" / "checkpoints" / "iter_000003.json").read_text())
    warm = second.run.metadata()["warm_started"]
    assert (warm["run_id"], warm["checkpoint"], warm["source_iteration"], warm["sha256"]) == (
        "first", "iter_000003", 3, source_manifest["sha256"])

    # A resumed run keeps its own models: neither the flow helper nor the trainer re-applies.
    assert prepare_warm_start(second.run, store.open_run("first")) == {}
    resumed = make_trainer(hp, runs_dir, "second")
    assert resumed.maybe_warm_start() is False
    assert resumed.restore_latest_checkpoint() and resumed._memory_iteration == 2


def test_without_warm_start_the_run_starts_from_its_own_init(first_run):
    runs_dir, first_initial, _ = first_run
    fresh = make_trainer(tiny_params(rl=dict(num_iterations=FIRST_ITERATIONS)), runs_dir, "fresh")
    seen = first_updates_capture(fresh)
    fresh.run_iterations(0, 1)
    for key, value in first_initial.items():
        assert torch.equal(seen["weights"][key], value), key
    assert "warm_started" not in fresh.run.metadata()


def test_corrupt_warm_start_checkpoint_is_refused_naming_the_file(first_run):
    runs_dir, _, first_final = first_run
    trainer = make_trainer(tiny_params(rl=dict(num_iterations=2)), runs_dir, "corrupt")
    prepare_warm_start(trainer.run, RunStore(str(runs_dir)).open_run("first"))
    path = runs_dir / "corrupt" / "warm_start" / "iter_000003.pt"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    before = weights(trainer)
    with pytest.raises(CorruptCheckpointError, match=r"corrupt/warm_start/iter_000003\.pt.*sha256"):
        trainer.run_iterations(0, 1)
    assert all(torch.equal(before[k], v) for k, v in weights(trainer).items())  # nothing loaded
    assert trainer._memory_iteration == 0 and not trainer.run.has_state()


def test_warm_start_with_other_model_shapes_is_refused_naming_them(first_run):
    runs_dir, _, _ = first_run
    hp = tiny_params(rl=dict(num_iterations=2))
    hp = HyperParameters.from_dict({**hp.to_dict(), "d_representation": 6})
    trainer = make_trainer(hp, runs_dir, "wider")
    prepare_warm_start(trainer.run, RunStore(str(runs_dir)).open_run("first"))
    with pytest.raises(WarmStartError, match=r"wider/warm_start/iter_000003\.pt does not fit.*shape mismatch "
                                             r".*checkpoint \(\d+, 4\) vs run \(\d+, 6\)"):
        trainer.run_iterations(0, 1)
    assert not trainer.run.has_state()


# -- pure text --------------------------------------------------------------------------------


def ei_params():
    return HyperParameters(scenario="code_validation", trainer="pure_text_ei", dataset="nipflow-cv",
                           rl={"num_iterations": 2, "rollouts_per_iteration": 4},
                           dataset_options={"max_train_size": 8, "max_test_size": 4})


def ei_trainer(tmp_path, run_id):
    # No server: building a pure-text trainer makes no request (the client is lazy).
    settings = ExperimentSettings(use_wandb=False, runs_dir=str(tmp_path / "runs"), run_id=run_id,
                                  openai_base_url="http://127.0.0.1:9/v1", show_progress=False)
    return build_trainer(ei_params(), settings)


def test_warm_started_ei_trainer_samples_with_the_previous_fine_tuned_models(tmp_path):
    first = ei_trainer(tmp_path, "first")
    groups = sorted(first.groups)
    final = {name: f"ft:{first.groups[name].params.model_name}:{name}:iter1" for name in groups}
    for name, group in first.groups.items():  # the state a finished run leaves
        group.state.fine_tuned_model_name = final[name]
        group.state.fine_tune_job_id = f"job-{name}"
    first.state.iteration, first.state.train_loop_stage = 2, "done"
    first.save_state()

    second = ei_trainer(tmp_path, "second")
    base = {name: g.model_name for name, g in second.groups.items()}
    assert base != final
    record = prepare_warm_start(second.run, RunStore(str(tmp_path / "runs")).open_run("first"))
    assert record["checkpoints"] == [] and record["models"] == final
    assert json.loads((tmp_path / "runs" / "second" / MODELS_FILE).read_text())["groups"] == final

    warm = warm_start_pure_text(second)
    assert warm["run_id"] == "first" and warm["models"] == final
    assert {name: g.model_name for name, g in second.groups.items()} == final
    assert all(g.state.fine_tune_job_id is None for g in second.groups.values())  # no stale job carried over
    assert second.run.metadata()["warm_started"]["models"] == final

    # The first sampling uses them (models/iter_0.json records what iteration 0 samples with).
    used = {}

    def fake_sampling(environment, iteration, use_tqdm=False, tqdm_desc=""):
        used.update({name: g.model_name for name, g in second.groups.items()})
        return []

    second._sample_rollouts = fake_sampling
    second.check_models_fine_tunable = lambda: None  # no API server here (sampling is faked too)
    assert second.run_stage("sample_rollouts")["next_stage"] == "log_stats"
    assert used == final
    assert json.loads((tmp_path / "runs" / "second" / "models" / "iter_0.json").read_text()) == final

    # Applied once: a resumed trainer takes the models from its own state and skips the warm start.
    resumed = ei_trainer(tmp_path, "second")
    assert warm_start_pure_text(resumed) is None
    assert {name: g.model_name for name, g in resumed.groups.items()} == final


def test_pure_text_warm_start_with_other_groups_is_refused(tmp_path):
    trainer = ei_trainer(tmp_path, "other")
    trainer.run.write_json(MODELS_FILE, {"run_id": "elsewhere", "groups": {"someone_else": "ft:x"}})
    with pytest.raises(WarmStartError, match=r"other/warm_start/models\.json: groups \['someone_else'\]"):
        warm_start_pure_text(trainer)
    assert not trainer.run.has_state()

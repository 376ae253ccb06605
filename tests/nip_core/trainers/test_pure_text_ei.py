"""pure_text_ei: selection, annealing, datapoint order, stage order, failures, learning."""

from __future__ import annotations

import numpy as np
import pytest

from nip_core.errors import FineTuneJobFailed
from nip_core.parameters import HyperParameters, PureTextEiParameters
from nip_core.settings import ExperimentSettings
from nip_core.trainers.build import build_trainer
from nip_core.trainers.pure_text_ei import guess_replacement_proportion, select_rollouts
from nip_core.trainers.pure_text_rollouts import datapoint_indices, stable_seed
from nip_core.trainers.pure_text_stats import verifier_decision
from nip_core.trainers.stages import FineTuneJobsPending, StageOrderError

import nip_core.trainers.catalogue  # noqa: F401


def test_threshold_selection_keeps_rewards_at_or_above_it():
    p = PureTextEiParameters(reward_threshold=0.9)
    assert select_rollouts(np.array([1.0, -1.0, 0.9, 0.5]), "threshold", p, np.random.default_rng(0)) == [0, 2]


def test_weighted_sampling_size_and_support():
    p = PureTextEiParameters(rollout_selection_method="weighted_sampling", weighting_epsilon=0.0,
                             weighting_use_replacement=True, weighting_sample_size_factor=0.5)
    picked = select_rollouts(np.array([-1.0, 1.0, 1.0, -1.0]), "weighted_sampling", p, np.random.default_rng(0))
    assert len(picked) == 2 and set(picked) <= {1, 2}  # the minimum gets weight 0


@pytest.mark.parametrize("annealing,expected", [("none", 0.5), ("linear", 0.3), ("exponential", 0.405)])
def test_guess_replacement_annealing(annealing, expected):
    assert guess_replacement_proportion(0.5, annealing, 0.1, 2) == pytest.approx(expected)


def test_datapoint_order_never_hangs_past_the_dataset_and_is_stable():
    # docs/behaviour.md#b31: 10 items, 6 per iteration, iteration 2 starts past the end.
    idx = datapoint_indices(7, 10, 12, 6)
    assert len(idx) == 6 and all(0 <= i < 10 for i in idx)
    first_epoch = datapoint_indices(7, 10, 0, 10)
    assert sorted(first_epoch) == list(range(10))
    assert datapoint_indices(7, 10, 12, 6) == idx
    # sha256-based: the same in every process (Python's hash() is salted, docs/behaviour.md#b22)
    assert stable_seed(1, "a") == 4711607286779601954 and stable_seed(1, "a", modulus=2**16) == 58402
    assert stable_seed(1, "a") != stable_seed(1, "b")


def params(tmp_path, **kw):
    base = dict(scenario="code_validation", trainer="pure_text_ei", dataset="nipflow-cv",
                rl={"num_iterations": 2, "rollouts_per_iteration": 24}, nip_protocol={"max_message_rounds": 4},
                dataset_options={"max_train_size": 24, "max_test_size": 4},
                text_rl={"verifier_guess_replacement_proportion": 0.5})
    base.update(kw)
    return HyperParameters(**base)


def settings(tmp_path, url, run_id="r"):
    return ExperimentSettings(use_wandb=False, runs_dir=str(tmp_path / "runs"), run_id=run_id, openai_base_url=url,
                              fine_tune_poll_interval_s=0.1, fine_tune_poll_max_interval_s=0.5,
                              max_concurrent_requests=8, show_progress=False)


@pytest.mark.e2e
def test_stage_order_is_enforced_and_pending_jobs_do_not_block(tmp_path, server):
    t = build_trainer(params(tmp_path, text_rl={"test_scheme": "last", "transcript_format": "json",
                                               "verifier_guess_replacement_proportion": 0.5}),
                      settings(tmp_path, server.base_url))
    with pytest.raises(StageOrderError, match="state is at iteration 0, stage 'sample_rollouts'"):
        t.run_stage("log_stats")
    seen = []
    while t.next_stage()[1] != "await_fine_tune_jobs":
        seen.append(t.run_stage(t.next_stage()[1])["next_stage"])
    assert seen == ["log_stats", "test_during_training", "create_fine_tune_jobs", "await_fine_tune_jobs"]
    assert set(t.poll_fine_tune_jobs()) == {"prover", "verifier"}
    try:
        t.run_await_stage(block=False)
    except FineTuneJobsPending as e:
        assert set(e.statuses) == {"prover", "verifier"}
    t.train()
    assert t.next_stage() == (2, "done")
    run = t.run
    assert run.exists("rollouts/0.json") and run.exists("rollouts/1.json") and run.exists("rollouts/test_1.json")
    assert not run.exists("rollouts/test_0.json")  # test_scheme "last"
    transcript = run.read_json("transcripts/raw_0.json")
    assert len(transcript) == 24 and set(transcript[0]) == {"transcript", "y", "question", "solution",
                                                            "prover_stance", "reward"}
    metrics = [m for m in run.read_metrics() if "mean_accuracy" in m]
    assert len(metrics) == 2 and all("verifier.mean_episode_reward" in m and m["tokens_used"] > 0 for m in metrics)
    assert metrics[1]["fine_tune_trained_tokens"] > 0
    # the card's figures: sampling time, each job's time by the API's clock, accuracy by mutation
    assert run.read_json("stages/it0_sample_rollouts.json")["sampling_seconds"] > 0
    waited = run.read_json("stages/it0_await_fine_tune_jobs.json")
    client = server.client()
    for group, job_id in run.read_json("stages/it0_create_fine_tune_jobs.json")["jobs"].items():
        job = client.fine_tuning.jobs.retrieve(job_id)
        assert waited["fine_tune_seconds"][group] == job.finished_at - job.created_at
    test = next(m for m in run.read_metrics() if m.get("kind") == "test")
    env, rollouts = t.scenario.test_environment, t.load_rollouts("test_1")
    kinds = [env.dataset[int(r["datapoint_id"][0])].mutation or "correct" for r in rollouts]
    assert len(set(kinds)) >= 2
    assert {k for k in test if "by_kind" in k} == {f"test_{s}_by_kind.{k}" for k in kinds
                                                   for s in ("accuracy", "count")}
    for kind in set(kinds):
        right = [verifier_decision(r, 1) == int(r["y"][0]) for r, k in zip(rollouts, kinds) if k == kind]
        assert (test[f"test_count_by_kind.{kind}"], test[f"test_accuracy_by_kind.{kind}"]) == (
            len(right), pytest.approx(sum(right) / len(right)))


@pytest.mark.e2e
def test_a_job_that_ends_badly_on_its_last_attempt_stops_the_run_with_its_error(tmp_path, server):
    hp = params(tmp_path, text_rl={"verifier_guess_replacement_proportion": 0.5, "fine_tune_max_attempts": 1})
    t = build_trainer(hp, settings(tmp_path, server.base_url, "failing"))
    while t.next_stage()[1] != "await_fine_tune_jobs":
        t.run_stage(t.next_stage()[1])
    client = t.scenario.extras["client"]()
    job_id = t.groups["verifier"].state.fine_tune_job_id
    client.fine_tuning.jobs.cancel(job_id)
    with pytest.raises(FineTuneJobFailed, match=f"{job_id} of group 'verifier' cancelled: 1 attempt"):
        t.run_stage("await_fine_tune_jobs")
    assert t.next_stage() == (0, "await_fine_tune_jobs")


def test_a_cancelled_job_is_retried_by_the_await_stage(tmp_path, server):
    t = build_trainer(params(tmp_path), settings(tmp_path, server.base_url, "retried"))
    while t.next_stage()[1] != "await_fine_tune_jobs":
        t.run_stage(t.next_stage()[1])
    client = t.scenario.extras["client"]()
    job_id = t.groups["verifier"].state.fine_tune_job_id
    client.fine_tuning.jobs.cancel(job_id)
    t.run_stage("await_fine_tune_jobs")
    assert t.next_stage() == (1, "sample_rollouts")
    assert t.state.shared_model_groups["verifier"].fine_tune_attempt == 2
    record = t.run.read_json("fine_tune/iter_0_verifier.json")
    assert [a["job_id"] for a in record["attempts"]] == [job_id] and record["job_id"] != job_id


@pytest.mark.e2e
@pytest.mark.slow
def test_expert_iteration_raises_verifier_train_accuracy(tmp_path, server, capsys):
    hp = params(tmp_path, rl={"num_iterations": 3, "rollouts_per_iteration": 24},
                dataset_options={"max_train_size": 24, "max_test_size": 4},
                text_rl={"verifier_guess_replacement_proportion": 0.5, "fine_tune_on_all_previous_rollouts": True})
    t = build_trainer(hp, settings(tmp_path, server.base_url, "learn"))
    t.train()
    acc = [m["mean_accuracy"] for m in t.run.read_metrics() if "mean_accuracy" in m]
    with capsys.disabled():
        print(f"\nEI nip verifier train accuracy per iteration: {acc}")
    assert len(acc) == 3
    assert acc[-1] >= acc[0] + 0.25


def test_a_model_the_api_cannot_fine_tune_fails_before_any_rollout(tmp_path, server):
    from nip_core.llm.capabilities import ModelNotFineTunableError

    hp = params(tmp_path, agents={"_default": {"model_name": "no-such-model"}})
    t = build_trainer(hp, settings(tmp_path, server.base_url, "unknown-model"))
    with pytest.raises(ModelNotFineTunableError, match="no-such-model.*supervised"):
        t.run_stage("sample_rollouts")
    assert not t.run.exists("rollouts/0.json") and t.next_stage() == (0, "sample_rollouts")


@pytest.mark.e2e
def test_overridden_sample_rollouts_and_get_log_stats_serve_training_and_testing(tmp_path, server, monkeypatch):
    """nip's guide: sampling is customised by overriding ``_sample_rollouts`` ("this also
    affects the test loop"), logging by overriding ``_get_log_stats``."""
    from nip_core.trainers import registry
    from nip_core.trainers.pure_text_ei import PureTextEiTrainer

    calls, sampled = [], []

    class CountingEi(PureTextEiTrainer):
        def _sample_rollouts(self, environment, iteration, use_tqdm=False, tqdm_desc="Sampling rollouts"):
            env = {id(self.scenario.train_environment): "train", id(self.scenario.test_environment): "test"}
            sampled.append((env[id(environment)], iteration))
            return super()._sample_rollouts(environment, iteration, use_tqdm, tqdm_desc)

        def _get_log_stats(self, rollouts, *, train=True):
            stats = super()._get_log_stats(rollouts, train=train)
            calls.append(train)
            stats["custom.rollouts"] = float(len(rollouts))
            return stats

    registry.get_trainer_class("pure_text_ei")  # the built-ins are registered; then this one replaces its class
    monkeypatch.setitem(registry.TRAINER_REGISTRY, "pure_text_ei", CountingEi)
    hp = params(tmp_path, rl={"num_iterations": 1, "rollouts_per_iteration": 8, "num_test_iterations": 1},
                text_rl={"test_scheme": "last", "verifier_guess_replacement_proportion": 0.5})
    t = build_trainer(hp, settings(tmp_path, server.base_url, "custom-stats"))
    assert type(t) is CountingEi
    t.train()
    rows = t.run.read_metrics()
    assert sampled == [("train", 0), ("test", "test")] and calls == [True, False]
    assert [(r["kind"], r["custom.rollouts"]) for r in rows] == [("train", 8.0), ("test", 4.0)]
    assert "mean_accuracy" in rows[0] and "test_mean_accuracy" in rows[1]

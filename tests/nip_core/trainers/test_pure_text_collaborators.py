"""The parts of PureTextRlTrainer: the fine-tune hook, the waiter, the rerun replay, the
final ``test`` stage, the orchestration protocols."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

import nip_core.trainers.catalogue  # noqa: F401
from nip_core.errors import NipflowError
from nip_core.parameters import HyperParameters
from nip_core.runs import RunStore
from nip_core.settings import ExperimentSettings
from nip_core.trainers import stages
from nip_core.trainers.fine_tune_waiter import FineTuneJobsPending, FineTuneWaiter, FineTuneWaitTimeout
from nip_core.trainers.interfaces import IterationTrainer, RecoverableStagedTrainer, StagedTrainer
from nip_core.trainers.pure_text_base import PureTextRlTrainer
from nip_core.trainers.pure_text_ei import PureTextEiTrainer
from nip_core.trainers.pure_text_rerun import BaseRunReplay


def params():
    return HyperParameters(scenario="code_validation", trainer="pure_text_ei", dataset="nipflow-cv",
                           rl={"num_iterations": 2, "rollouts_per_iteration": 24},
                           nip_protocol={"max_message_rounds": 4},
                           dataset_options={"max_train_size": 24, "max_test_size": 4},
                           text_rl={"verifier_guess_replacement_proportion": 0.5})


def settings(tmp_path, url, run_id):
    return ExperimentSettings(use_wandb=False, runs_dir=str(tmp_path / "runs"), run_id=run_id, openai_base_url=url,
                              fine_tune_poll_interval_s=0.1, fine_tune_poll_max_interval_s=0.5,
                              max_concurrent_requests=8, show_progress=False)


class VerifierOnlyEi(PureTextEiTrainer):
    """Fine-tunes the verifier only (the guide's hook, with the example-building helper), and
    names its jobs (nip's ``_get_fine_tune_job_name``)."""

    def _stage_create_fine_tune_jobs(self, rollouts):
        return {"verifier": self.create_group_fine_tune_job(
            "verifier", self._build_fine_tune_examples("verifier", rollouts))}

    def _get_fine_tune_job_name(self, shared_model_group):
        return f"only-{self.state.iteration}-{shared_model_group.group_name}"


def test_overriding_the_create_hook_changes_which_jobs_are_created_and_the_run_proceeds(tmp_path, server):
    hp = params()
    st = settings(tmp_path, server.base_url, "verifier-only")
    t = VerifierOnlyEi(hp, settings=st, run=RunStore(st.runs_dir).open_run("verifier-only", hp))
    assert isinstance(t, StagedTrainer) and isinstance(t, RecoverableStagedTrainer)
    assert not isinstance(t, IterationTrainer)
    summaries = []
    while t.next_stage().stage != "done":
        summaries.append(t.run_stage(t.next_stage().stage))
    assert [(s["iteration"], s["stage"]) for s in summaries] == [
        (0, "sample_rollouts"), (0, "log_stats"), (0, "test_during_training"), (0, "create_fine_tune_jobs"),
        (0, "await_fine_tune_jobs"), (1, "sample_rollouts"), (1, "log_stats"), (1, "test_during_training"),
        (2, "test")]
    assert set(summaries[3]["jobs"]) == {"verifier"} and set(summaries[4]["trained_tokens"]) == {"verifier"}
    jobs = [j for j in server.client().fine_tuning.jobs.list(limit=100).data
            if (j.metadata or {}).get("nipflow_run_id") == "verifier-only"]
    assert [(j.metadata["nipflow_iteration"], j.metadata["nipflow_group"], j.user_provided_suffix)
            for j in jobs] == [("0", "verifier", "only-0-verifier")]
    models = t.run.read_json("models/iter_1.json")
    assert models["prover"] == hp.agent_params("prover").model_name  # never fine-tuned
    assert models["verifier"] == jobs[0].fine_tuned_model is not None
    assert t.run.load_state(t.State).shared_model_groups["prover"].fine_tune_job_id is None


def test_a_trainer_without_a_way_to_create_jobs_is_refused():
    class NoJobs(PureTextRlTrainer):
        pass

    with pytest.raises(TypeError, match="NoJobs must define _stage_create_fine_tune_jobs or agent_fine_tune_examples"):
        NoJobs(None)


class FakeGroup:
    def __init__(self, statuses):
        self.statuses = list(statuses)
        self.state = SimpleNamespace(last_status=None)
        self.retries = 0

    def get_fine_tune_job_status(self):
        self.state.last_status = self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]
        return self.state.last_status

    def retry_failed_job(self, **kwargs):
        assert kwargs == {"run": None, "run_id": "r", "iteration": 3}
        self.retries += 1


def waiter(groups, timeout=None):
    slept, saves, now = [], [], [0.0]

    def sleep(s):
        slept.append(s)
        now[0] += s

    st = SimpleNamespace(fine_tune_poll_interval_s=0.1, fine_tune_poll_max_interval_s=0.5,
                         fine_tune_wait_timeout_s=timeout)
    w = FineTuneWaiter(groups, st, lambda: saves.append(1), lambda: {"run": None, "run_id": "r", "iteration": 3},
                       sleep=sleep, clock=lambda: now[0])
    return w, slept, saves


def test_waiter_backs_off_saves_status_changes_and_retries_failed_jobs():
    a = FakeGroup(["pending", "running", "running", "running", "running", "running", "succeeded"])
    b = FakeGroup(["failed", "running", "succeeded"])
    w, slept, saves = waiter({"a": a, "b": b})
    assert w.wait(3, block=True) == {"a": "succeeded", "b": "succeeded"}
    assert b.retries == 1
    assert slept == [0.1, 0.2, 0.4, 0.5, 0.5]  # the failed poll retried at once, then doubling up to the max
    # status changes: pending/failed, (retry), running/running, succeeded (b), succeeded (a)
    assert len(saves) == 5


def test_waiter_non_blocking_and_timeout():
    w, slept, _ = waiter({"a": FakeGroup(["running"])}, timeout=1.0)
    with pytest.raises(FineTuneJobsPending) as e:
        w.wait(3, block=False)
    assert e.value.statuses == {"a": "running"} and slept == []
    with pytest.raises(FineTuneWaitTimeout, match=r"iteration 3: fine-tune jobs \{'a': 'running'\} not finished after 1.0 s"):
        w.wait(3, block=True)
    assert slept == [0.1, 0.2, 0.4, 0.5]


class FakeRun:
    def __init__(self, files):
        self.run_id, self.files = "base", files

    def exists(self, path):
        return path in self.files

    def read_json(self, path, what=""):
        return self.files[path]


def test_base_run_replay_loads_each_iterations_models_and_refuses_an_empty_base_run():
    with pytest.raises(NipflowError, match="base_run.run_id: run 'base' has no models/iter_0.json"):
        BaseRunReplay(FakeRun({}))
    replay = BaseRunReplay(FakeRun({"models/iter_0.json": {"g": "base-model"}, "models/iter_1.json": {"g": "ft:1"}}))
    group = SimpleNamespace(params=SimpleNamespace(model_name="base-model"),
                            state=SimpleNamespace(fine_tuned_model_name="stale"))
    assert replay.load_into({"g": group}, 1) and group.state.fine_tuned_model_name == "ft:1"
    assert replay.load_into({"g": group}, 0) and group.state.fine_tuned_model_name is None
    assert not replay.load_into({"g": group}, 2) and group.state.fine_tuned_model_name is None
    with pytest.raises(NipflowError, match="has no model for group 'h'"):
        replay.load_into({"h": group}, 1)


@pytest.mark.parametrize("rerun, version, scheme, tested", [
    (False, 0, "last", [2]), (False, 0, "none", []), (False, 0, "first_and_last", [2]),
    (True, 2, "all", [2]),  # the rerun replayed the base run's last iteration
    (True, 1, "all", []),  # the base run stopped after iteration 1: no final models to test
])
def test_the_test_stage_tests_the_final_models(rerun, version, scheme, tested):
    calls = []
    trainer = SimpleNamespace(
        num_iterations=3, base_run=object() if rerun else None, logger=logging.getLogger("t"),
        state=SimpleNamespace(iteration=3, base_run_state_artifact_version=version),
        should_test=lambda i: {"last": i == 2, "none": False, "first_and_last": i in (0, 2), "all": True}[scheme],
        run_test_loop_at=lambda i: calls.append(i) or {"test_mean_accuracy": 0.5})
    out = stages.STAGES[stages.Stage.TEST](trainer)
    assert calls == tested and out == ({"metrics": {"test_mean_accuracy": 0.5}} if tested else {})


def test_the_drivers_reload_gives_the_groups_the_stored_state(tmp_path, server):
    """``tasks.stages.refresh_state`` (what a stage task and the pure-text flow call before
    each stage and after a suspension) goes through the trainer's ``reload_state``: a job id
    another driver stored reaches the trainer's shared model groups, not only its state."""
    from tasks.stages import refresh_state

    hp = params()
    st = settings(tmp_path, server.base_url, "reload")
    store = RunStore(st.runs_dir)
    stale = PureTextEiTrainer(hp, settings=st, run=store.open_run("reload", hp))
    other = PureTextEiTrainer(hp, settings=st, run=store.open_run("reload", hp))
    other.groups["verifier"].state.fine_tune_job_id = "ftjob-from-the-other-driver"
    other.save_state()
    assert stale.groups["verifier"].state.fine_tune_job_id is None
    refresh_state(stale)
    assert stale.state.shared_model_groups["verifier"].fine_tune_job_id == "ftjob-from-the-other-driver"
    assert stale.groups["verifier"].state.fine_tune_job_id == "ftjob-from-the-other-driver"

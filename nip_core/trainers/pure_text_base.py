"""``PureTextRlTrainer``: the resumable stage machine of the pure-text trainers (spec §5.5-5.6).

Every stage runs through :meth:`PureTextRlTrainer.run_stage`, which refuses a stage the
state is not at, runs the stage function of :data:`nip_core.trainers.stages.STAGE_FUNCTIONS`
and writes the state atomically. Rollouts of iteration ``i`` are written once to
``rollouts/{i}.json`` (never rewritten: a sampling stage that finds the file reuses it),
transcripts to ``transcripts/raw_{i}.{yaml|json}``, and the model each group samples
iteration ``i`` with to ``models/iter_{i}.json`` (also written once).

Rerun-tests mode (``base_run.base_run_type == "rerun_tests"``; the hyper-parameters are
the base run's except the preserved test fields, see
:mod:`nip_core.parameters.base_run`): iteration ``i`` loads the base run's
``models/iter_{i}.json`` instead of sampling and fine-tuning, and runs the test loop where
the (current) test scheme asks for it. The stages are the same (``sample_rollouts`` ->
``test_during_training`` -> next iteration), so a rerun resumes like any run; it stops at
the first iteration the base run never reached.
"""

from __future__ import annotations

import os
import signal
import time
from abc import abstractmethod
from typing import Any

import yaml
from pydantic import Field

from nip_core.agents.pure_text import PureTextSharedModelGroupState
from nip_core.environments.nested_array_dict import NestedArrayDict
from nip_core.errors import NipflowError
from nip_core.scenarios.registry import build_scenario_instance
from nip_core.trainers.base import Trainer, TrainerState
from nip_core.trainers.pure_text_rollouts import TextActor, datapoint_indices, sample_rollouts, stable_seed
from nip_core.trainers.pure_text_stats import raw_transcript, rollout_stats
from nip_core.trainers.stages import STAGE_FUNCTIONS, STAGE_ORDER, FineTuneJobsPending, StageOrderError

KILL_AT_ENV = "NIPFLOW_TEST_KILL_AT"  # test-only, see maybe_kill


class FineTuneWaitTimeout(NipflowError, TimeoutError):
    def __init__(self, iteration: int, statuses: dict[str, str], timeout: float):
        super().__init__(f"iteration {iteration}: fine-tune jobs {statuses} not finished after {timeout} s")


def maybe_kill(iteration: int, stage: str, point: str = "") -> None:
    """Test seam: SIGKILL this process at a named point.

    ``NIPFLOW_TEST_KILL_AT`` is a comma-separated list of ``<iteration>:<stage>:<point>``;
    with ``NIPFLOW_TEST_KILL_MARKERS`` (a directory) each point kills only once (a marker
    file is written first), so that a resumed process gets past it.
    """
    wanted = os.environ.get(KILL_AT_ENV)
    here = f"{iteration}:{stage}:{point}"
    if not wanted or here not in wanted.split(","):
        return
    markers = os.environ.get("NIPFLOW_TEST_KILL_MARKERS")
    if markers:
        marker = os.path.join(markers, here.replace(":", "_"))
        if os.path.exists(marker):
            return
        open(marker, "w").close()
    os.kill(os.getpid(), signal.SIGKILL)


class PureTextState(TrainerState):
    train_loop_stage: str = "sample_rollouts"
    shared_model_groups: dict[str, PureTextSharedModelGroupState] = Field(default_factory=dict)
    tokens_used: int = 0
    last_trained_tokens: int = 0


class PureTextRlTrainer(Trainer):
    """Base of ``pure_text_ei`` and ``pure_text_malt``; subclasses build the fine-tune jobs."""

    State = PureTextState

    def __init__(self, hyper_params, settings=None, run=None, hooks=None, stat_logger=None, scenario=None):
        super().__init__(hyper_params, settings, run=run, hooks=hooks, stat_logger=stat_logger)
        self.scenario = scenario or build_scenario_instance(hyper_params, self.settings)
        self.protocol_handler = self.scenario.protocol_handler
        self.groups = self.scenario.shared_model_groups
        self.agent_names = list(self.protocol_handler.agent_names)
        self.verifier_index = self.agent_names.index("verifier")
        self._push_group_states()
        base = self.hyper_params.base_run
        self.rerun_tests = base.base_run_type == "rerun_tests"
        self._base_run = None
        if self.rerun_tests:
            from nip_core.runs import RunStore

            self._base_run = RunStore(self.settings.runs_dir).open_run(base.run_id)

    # -- state ------------------------------------------------------------------------------

    def _push_group_states(self) -> None:
        for name, group in self.groups.items():
            if name in self.state.shared_model_groups:
                group.state = self.state.shared_model_groups[name].model_copy()

    def reload_state(self) -> None:
        super().reload_state()
        self._push_group_states()

    def save_state(self) -> None:
        self.state.shared_model_groups = {n: g.state.model_copy() for n, g in self.groups.items()}
        super().save_state()

    @property
    def run_id(self) -> str:
        return self.run.run_id if self.run is not None else (self.settings.run_id or "NO_RUN_ID")

    @property
    def num_iterations(self) -> int:
        return self.hyper_params.rl.num_iterations

    @property
    def rollouts_per_iteration(self) -> int:
        rl = self.hyper_params.rl
        return rl.rollouts_per_iteration or rl.frames_per_batch or 1

    # -- the stage API ---------------------------------------------------------------------

    def next_stage(self) -> tuple[int, str]:
        return int(self.state.iteration), self.state.train_loop_stage

    def run_stage(self, stage: str) -> dict[str, Any]:
        """Run ``stage`` (must be the state's stage), save the state, return a summary.

        Raises
        ------
        StageOrderError
            If the state is at another stage.
        """
        iteration, current = self.next_stage()
        if stage != current or stage == "done":
            raise StageOrderError(stage, iteration, current)
        if (iteration, stage) == (0, "sample_rollouts"):  # here, not in __init__: flows add warm_start/ later
            from nip_core.trainers.warm_start import warm_start_pure_text

            warm_start_pure_text(self)
            self._push_group_states()
            self.check_models_fine_tunable()
        self._push_group_states()
        maybe_kill(iteration, stage, "start")
        summary: dict[str, Any] = {"iteration": iteration, "stage": stage}
        nxt = getattr(self, STAGE_FUNCTIONS[stage])(summary)
        summary["next_iteration"], summary["next_stage"] = nxt
        if self.run is not None and not self.settings.test_run:  # before the state: see stored_stage_summary
            self.run.write_json(self._summary_path(iteration, stage), summary)
        self.state.iteration, self.state.train_loop_stage = nxt
        self.save_state()
        self.log_run_artifact("state", "state", ["state.json", "hyper_params.json"])
        maybe_kill(iteration, stage, "end")
        self.hooks.on_stage_end(stage, iteration)
        return summary

    def check_models_fine_tunable(self) -> None:
        """Fail before the first rollout if a group's model cannot be fine-tuned by this method.

        Asks the API's model list (see :mod:`nip_core.llm.capabilities`): a model the server
        does not know, or DPO on a base model that only offers supervised jobs, would
        otherwise fail only after a whole iteration of (paid) sampling.
        """
        if self.rerun_tests or self.num_iterations < 2:
            return  # no fine-tune job will be created
        from nip_core.llm.capabilities import check_fine_tunable

        for group in self.groups.values():
            if not group.frozen:
                base = group.params.model_name if group.params.fine_tune_from_scratch else group.model_name
                check_fine_tunable(group._client(), base, self.fine_tune_method)

    def _summary_path(self, iteration: int, stage: str) -> str:
        return f"stages/it{iteration}_{stage}.json"

    def stored_stage_summary(self, iteration: int, stage: str) -> dict[str, Any] | None:
        """The summary ``run_stage`` returned for a completed stage (None if not stored).

        It is written before the state moves past the stage, so a process that died
        between the two leaves a summary of the stage that the state shows as done
        (orchestrators rebuild their view of a recovered stage from it).
        """
        if self.run is None or not self.run.exists(self._summary_path(iteration, stage)):
            return None
        return self.run.read_json(self._summary_path(iteration, stage), "stage summary")

    def train(self) -> None:
        with self.make_iteration_context(self.num_iterations, "iterations") as bar:
            bar.step(min(self.state.iteration, self.num_iterations))
            while self.next_stage()[1] != "done":
                before = self.state.iteration
                self.run_stage(self.next_stage()[1])
                if self.state.iteration > before and self.state.iteration <= self.num_iterations:
                    bar.step(self.state.iteration - before)

    # -- sampling ---------------------------------------------------------------------------

    def _rollouts_path(self, name: str) -> str:
        return f"rollouts/{name}.json"

    def _sample(self, dataset: Any, env: Any, count: int, start: int, tag: str) -> tuple[list[NestedArrayDict], int]:
        indices = datapoint_indices(self.hyper_params.seed, len(dataset), start, count)
        seeds = [stable_seed(self.hyper_params.seed, tag, k, modulus=2**16) for k in range(count)]
        actor = TextActor(env, self.scenario.agents, self.hyper_params.interaction_protocol, self.hyper_params)
        ctx = self.make_iteration_context(count, f"{tag}: sampling rollouts")
        with ctx:
            rollouts = sample_rollouts(env, actor, dataset, indices, seeds, self.settings.max_concurrent_requests,
                                       on_done=ctx.step)
        return rollouts, actor.tokens

    def sample_train_rollouts(self, iteration: int) -> tuple[list[NestedArrayDict], int]:
        """The training rollouts of ``iteration`` and the tokens spent (MALT samples trees instead)."""
        n = self.rollouts_per_iteration
        return self._sample(self.scenario.train_dataset, self.scenario.train_environment, n, n * iteration,
                            f"train-{iteration}")

    def load_rollouts(self, name: str) -> list[NestedArrayDict]:
        return [NestedArrayDict.from_dict(d) for d in self.run.read_json(self._rollouts_path(name), "rollouts")]

    def _save_rollouts(self, name: str, rollouts: list[NestedArrayDict]) -> None:
        if self.run is None or self.settings.test_run:
            return
        self.run.write_json(self._rollouts_path(name), [r.to_dict() for r in rollouts])
        self.log_run_artifact("full_rollouts", "full_rollouts", [self._rollouts_path(name)])
        text_rl = self.hyper_params.text_rl
        if text_rl.save_transcripts:
            data = [raw_transcript(r, self.agent_names) for r in rollouts]
            ext = text_rl.transcript_format
            path = f"transcripts/raw_{name}.{ext}"
            if ext == "yaml":
                self.run.storage.write_bytes(path, yaml.safe_dump(data, sort_keys=False).encode())
            else:
                self.run.write_json(path, data)
            self.log_run_artifact("raw_transcript", "raw_transcript", [path])

    def _iteration_rollouts(self, iteration: int) -> list[NestedArrayDict]:
        if getattr(self, "_cache", None) and self._cache[0] == iteration:
            return self._cache[1]
        rollouts = self.load_rollouts(str(iteration))
        self._cache = (iteration, rollouts)
        return rollouts

    # -- stage functions -------------------------------------------------------------------

    def _models_path(self, iteration: int) -> str:
        return f"models/iter_{iteration}.json"

    def _record_models(self, iteration: int) -> None:
        if self.run is not None and not self.run.exists(self._models_path(iteration)):
            self.run.write_json(self._models_path(iteration), {n: g.model_name for n, g in self.groups.items()})

    def _load_base_run_models(self, iteration: int) -> bool:
        """Rerun mode: use the models the base run sampled ``iteration`` with; False if it never got there."""
        path = self._models_path(iteration)
        if not self._base_run.exists(path):
            return False
        models = self._base_run.read_json(path, "base run models")
        for name, g in self.groups.items():
            if name not in models:
                raise NipflowError(f"base run '{self._base_run.run_id}' {path} has no model for group '{name}'")
            g.state.fine_tuned_model_name = None if models[name] == g.params.model_name else models[name]
        return True

    def _stage_sample_rollouts(self, summary: dict) -> tuple[int, str]:
        i = self.state.iteration
        self.logger.info("[%d/%d] Iteration begins", i + 1, self.num_iterations)
        if self.rerun_tests:
            if not self._load_base_run_models(i):
                self.logger.info("base run '%s' has no iteration %d: rerun complete", self._base_run.run_id, i)
                return self.num_iterations, "test"
            self._record_models(i)
            return i, "test_during_training"
        self._record_models(i)
        if self.run is not None and self.run.exists(self._rollouts_path(str(i))):
            rollouts = self.load_rollouts(str(i))  # written by an interrupted attempt: never rewrite
        else:
            rollouts, tokens = self.sample_train_rollouts(i)
            self.state.tokens_used += tokens
            maybe_kill(i, "sample_rollouts", "before_save")
            self._save_rollouts(str(i), rollouts)
        self._cache = (i, rollouts)
        return i, "log_stats"

    def _stage_log_stats(self, summary: dict) -> tuple[int, str]:
        i = self.state.iteration
        rollouts = self._iteration_rollouts(i)
        stats = rollout_stats(rollouts, self.agent_names, self.verifier_index)
        stats.update(self.extra_train_stats(rollouts))
        stats["tokens_used"] = float(self.state.tokens_used)
        stats["fine_tune_trained_tokens"] = float(self.state.last_trained_tokens)
        self.log_stats(stats, i)
        summary["metrics"] = stats
        return i, "test_during_training"

    def extra_train_stats(self, rollouts: list[NestedArrayDict]) -> dict[str, float]:
        """Trainer-specific statistics of an iteration's training rollouts (MALT: tree stats)."""
        return {}

    def _should_test(self, i: int) -> bool:
        scheme, n = self.hyper_params.text_rl.test_scheme, self.num_iterations
        return {"none": False, "all": True, "last": i == n - 1, "first_and_last": i in (0, n - 1)}[scheme]

    def _stage_test_during_training(self, summary: dict) -> tuple[int, str]:
        i = self.state.iteration
        if self._should_test(i):
            ds = self.scenario.test_dataset
            reps = self.hyper_params.rl.num_test_iterations
            count = len(ds) * reps if self.hyper_params.text_rl.test_on_whole_dataset \
                else self.rollouts_per_iteration * reps
            name = f"test_{i}"
            if self.run is not None and self.run.exists(self._rollouts_path(name)):
                rollouts = self.load_rollouts(name)
            else:
                rollouts, tokens = self._sample(ds, self.scenario.test_environment, count, 0, name)
                self.state.tokens_used += tokens
                self._save_rollouts(name, rollouts)
            stats = rollout_stats(rollouts, self.agent_names, self.verifier_index, prefix="test_")
            self.log_stats(stats, i, kind="test")
            summary["metrics"] = stats
        if self.rerun_tests:
            return (i + 1, "sample_rollouts") if i + 1 < self.num_iterations else (self.num_iterations, "test")
        if i >= self.num_iterations - 1:
            return self.num_iterations, "test"
        return i, "create_fine_tune_jobs"

    def _stage_create_fine_tune_jobs_step(self, summary: dict) -> tuple[int, str]:
        i = self.state.iteration
        its = range(i + 1) if self.hyper_params.text_rl.fine_tune_on_all_previous_rollouts else [i]
        rollouts = [r for it in its for r in self._iteration_rollouts_any(it)]
        summary["jobs"] = self._stage_create_fine_tune_jobs(rollouts)
        return i, "await_fine_tune_jobs"

    def _iteration_rollouts_any(self, it: int) -> list[NestedArrayDict]:
        return self._iteration_rollouts(it) if it == self.state.iteration else self.load_rollouts(str(it))

    fine_tune_method: str = "supervised"  # or "dpo": which kind of job the groups create

    @abstractmethod
    def agent_fine_tune_examples(self, agent: str, rollouts: list[NestedArrayDict]) -> list[dict]:
        """The fine-tune examples of ``agent`` (SFT chats or DPO pairs) from ``rollouts``."""

    def _stage_create_fine_tune_jobs(self, rollouts: list[NestedArrayDict]) -> dict[str, str]:
        """Create (or adopt) one job per shared model group; return ``{group: job_id}``."""
        jobs = {}
        i = self.state.iteration
        for name, group in self.groups.items():
            examples = [e for agent in group.agent_names for e in self.agent_fine_tune_examples(agent, rollouts)]
            create = group.create_dpo_fine_tune_job if self.fine_tune_method == "dpo" \
                else group.create_supervised_fine_tune_job
            jobs[name] = create(examples, run=self.run, run_id=self.run_id, iteration=i,
                                seed=stable_seed(self.hyper_params.seed, i, name, modulus=2**31))
            self.save_state()  # the job id is in the state before the next group's call
            maybe_kill(i, "create_fine_tune_jobs", f"after_{name}")
        return jobs

    def poll_fine_tune_jobs(self) -> dict[str, str]:
        """Non-blocking status of every group's job of the current iteration."""
        self._push_group_states()
        if self.state.train_loop_stage != "await_fine_tune_jobs":
            return {}
        return {name: g.get_fine_tune_job_status() for name, g in self.groups.items()}

    def run_await_stage(self, block: bool) -> dict[str, Any]:
        """Wait for the jobs (backoff, bounded by ``fine_tune_wait_timeout_s``); see the stage API.

        Every change of a job's status is saved in the state (``nipflow status`` shows it);
        blocking waits show a progress bar over the groups.
        """
        if not block:
            return self._check_jobs(block=False)
        with self.make_iteration_context(len(self.groups), f"it {self.state.iteration}: fine-tune jobs") as bar:
            return self._check_jobs(block=True, bar=bar)

    def _check_jobs(self, block: bool, bar: Any = None) -> dict[str, Any]:
        i = self.state.iteration
        interval = self.settings.fine_tune_poll_interval_s
        deadline = None if self.settings.fine_tune_wait_timeout_s is None \
            else time.monotonic() + self.settings.fine_tune_wait_timeout_s
        done = 0
        while True:
            before = {n: g.state.last_status for n, g in self.groups.items()}
            statuses = self.poll_fine_tune_jobs()
            if statuses and any(before.get(n) != s for n, s in statuses.items()) and self.run is not None:
                self.save_state()
            if bar is not None:
                finished = sum(s == "succeeded" for s in statuses.values())
                bar.step(finished - done)
                done = finished
                bar.set_postfix(**statuses)
            retried = False
            for name, s in statuses.items():
                if s in ("failed", "cancelled"):  # a new attempt, or FineTuneJobFailed listing all
                    self.groups[name].retry_failed_job(run=self.run, run_id=self.run_id, iteration=i)
                    retried = True
            if retried:
                self.save_state()
                continue
            if all(s == "succeeded" for s in statuses.values()):
                return statuses
            if not block:
                raise FineTuneJobsPending(statuses)
            if deadline is not None and time.monotonic() > deadline:
                raise FineTuneWaitTimeout(i, statuses, self.settings.fine_tune_wait_timeout_s)
            time.sleep(interval)
            interval = min(interval * 2, self.settings.fine_tune_poll_max_interval_s)

    def _stage_await_fine_tune_jobs(self, summary: dict) -> tuple[int, str]:
        i = self.state.iteration
        self.run_await_stage(block=True)
        trained = {}
        for name, g in self.groups.items():
            trained[name] = g.trained_tokens()
            g.switch_to_next_model()
        self.state.last_trained_tokens = sum(trained.values())
        summary["trained_tokens"] = trained
        return i + 1, "sample_rollouts"

    def _stage_test(self, summary: dict) -> tuple[int, str]:
        self.logger.info("Training complete.")
        return self.state.iteration, "done"

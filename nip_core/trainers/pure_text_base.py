"""``PureTextRlTrainer``: the resumable stage machine of the pure-text trainers (docs/behaviour.md#b30).

A run moves through the stages of :mod:`nip_core.trainers.stage_machine`; every stage goes
through :meth:`PureTextRlTrainer.run_stage`, which refuses a stage the state is not at,
runs the stage function of :data:`nip_core.trainers.stages.STAGES`, computes the next
position with :func:`~nip_core.trainers.stage_machine.next_stage` and writes the state
atomically. The collaborators:

* :class:`~nip_core.trainers.pure_text_records.RolloutRecords`: rollouts (written once),
  transcripts, the models each iteration sampled with, stage summaries;
* :class:`~nip_core.trainers.fine_tune_waiter.FineTuneWaiter`: polling the jobs with
  backoff, retrying failed ones;
* :class:`~nip_core.trainers.pure_text_rerun.BaseRunReplay`: rerun-tests mode.

Subclasses say how an iteration's jobs are created: override
:meth:`PureTextRlTrainer._stage_create_fine_tune_jobs`, or define
:meth:`PureTextRlTrainer.agent_fine_tune_examples` and keep the default, which makes one
job per shared model group from the group members' examples. They may also override
nip's :meth:`_sample_rollouts` (training and test rollouts; MALT samples trees in
training) and :meth:`_get_log_stats` (the statistics of both; call the superclass and add).
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import Field

from nip_core.agents.pure_text import FineTuneBinding, PureTextSharedModelGroupState
from nip_core.environments.nested_array_dict import NestedArrayDict
from nip_core.parameters import ParameterError
from nip_core.scenarios.registry import build_scenario_instance
from nip_core.trainers.base import Trainer, TrainerState
from nip_core.trainers.fine_tune_waiter import FineTuneJobsPending, FineTuneWaiter, FineTuneWaitTimeout
from nip_core.trainers.hooks import reach_point
from nip_core.trainers.pure_text_records import RolloutRecords
from nip_core.trainers.pure_text_rerun import BaseRunReplay
from nip_core.scenarios.code_validation.text_protocols import build_chat_messages
from nip_core.trainers.pure_text_rollouts import TextActor, datapoint_indices, history_of, run_episodes, stable_seed
from nip_core.trainers.pure_text_stats import (NoAssistantMessageError, accuracy_by_kind, fine_tune_messages,
                                               rollout_stats)
from nip_core.trainers.stage_machine import Position, Stage, StageOrderError, next_stage

__all__ = ["FineTuneJobsPending", "FineTuneWaitTimeout", "PureTextRlTrainer", "PureTextState"]


class PureTextState(TrainerState):
    """The state of a pure-text run (``PureTextRlTrainer.State``), saved after every stage.

    Attributes
    ----------
    train_loop_stage
        The stage to run next (see :class:`~nip_core.trainers.stage_machine.Stage`).
    shared_model_groups
        The state of each shared model group (jobs, fine-tuned model).
    tokens_used, last_trained_tokens
        Tokens spent sampling so far; tokens the last iteration's jobs trained on.
    base_run_state_artifact_version
        Rerun-tests mode: the iteration of the base run whose models (its
        ``models/iter_{n}.json``) were loaded last; the rerun steps through them in order.
    """

    train_loop_stage: Stage = Stage.SAMPLE_ROLLOUTS
    shared_model_groups: dict[str, PureTextSharedModelGroupState] = Field(default_factory=dict)
    tokens_used: int = 0
    last_trained_tokens: int = 0
    base_run_state_artifact_version: int = Field(0, ge=0)


class PureTextRlTrainer(Trainer):
    """Base of ``pure_text_ei`` and ``pure_text_malt``; see the module docs."""

    State = PureTextState
    trainer_kind = "pure_text"  # registration reads these: a subclass needs only @register_trainer
    needs_critic = False
    fine_tune_method: str = "supervised"  # or "dpo": which kind of job the default hook creates

    def __init__(self, hyper_params, scenario_instance=None, settings=None, *, run=None, hooks=None,
                 stat_logger=None):
        own = type(self)
        if (own._stage_create_fine_tune_jobs is PureTextRlTrainer._stage_create_fine_tune_jobs
                and own.agent_fine_tune_examples is PureTextRlTrainer.agent_fine_tune_examples):
            raise TypeError(f"{own.__name__} must define _stage_create_fine_tune_jobs or agent_fine_tune_examples")
        if settings is not None and settings.num_rollout_workers:  # refused before anything is opened
            raise ParameterError([("settings.num_rollout_workers",
                                   f"pure-text trainers sample through the API, not in worker processes (got "
                                   f"{settings.num_rollout_workers}); settings.max_concurrent_requests sets "
                                   f"how many requests run at once")])
        super().__init__(hyper_params, scenario_instance, settings, run=run, hooks=hooks, stat_logger=stat_logger)
        if self.scenario_instance is None:
            self.scenario_instance = build_scenario_instance(hyper_params, self.settings)
        self.protocol_handler = self.scenario.protocol_handler
        self.groups = self.scenario.shared_model_groups
        self.agent_names = list(self.protocol_handler.agent_names)
        self.verifier_index = self.agent_names.index("verifier")
        for group in self.groups.values():  # nip's rollout-form job methods of the groups come back here
            group.bind(FineTuneBinding(submit=self.create_group_fine_tune_job, sft_examples=self.sft_examples,
                                       dpo_example=self.dpo_example))
        self._push_group_states()
        self.records = RolloutRecords(self.run, hyper_params.text_rl, self.agent_names, self.log_run_artifact)
        self.waiter = FineTuneWaiter(self.groups, self.settings, self.save_state, lambda: dict(
            run=self.run, run_id=self.run_id, iteration=self.state.iteration))
        base = hyper_params.base_run
        self.rerun_tests = base.base_run_type == "rerun_tests"
        self.base_run = BaseRunReplay.open(self.settings.runs_dir, base.run_id) if self.rerun_tests else None
        # The iteration whose models the test loop tests (its rollouts' seeds depend on it).
        self._tested_iteration: int | None = None

    # -- state -------------------------------------------------------------------------------

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
        return self.run.run_id  # a NullRun's: settings.run_id, or "NO_RUN_ID"

    @property
    def num_iterations(self) -> int:
        return self.hyper_params.rl.num_iterations

    @property
    def rollouts_per_iteration(self) -> int:
        rl = self.hyper_params.rl
        return rl.rollouts_per_iteration or rl.frames_per_batch or 1

    # -- the stage API -------------------------------------------------------------------------

    def next_stage(self) -> Position:
        """The position to run next: ``(iteration, stage)`` as saved in the state."""
        return Position(int(self.state.iteration), Stage(self.state.train_loop_stage))

    def run_stage(self, stage: str) -> dict[str, Any]:
        """Run ``stage`` (must be the state's stage), save the state, return a summary.

        The summary holds ``iteration``, ``stage``, ``next_iteration``, ``next_stage``, the
        wall time of the stage's work in this call (``seconds``; an attempt that died is not
        counted) and what the stage produced (``metrics``, ``sampling_seconds``, ``jobs``,
        ``trained_tokens``, ``fine_tune_seconds``).

        Raises
        ------
        StageOrderError
            If the state is at another stage, or at ``done``.
        """
        from nip_core.trainers.stages import STAGES

        iteration, current = self.next_stage()
        if stage != current or current is Stage.DONE:
            raise StageOrderError(str(stage), iteration, current.value)
        if (iteration, current) == (0, Stage.SAMPLE_ROLLOUTS):  # here, not in __init__: flows add warm_start/ later
            from nip_core.trainers.warm_start import warm_start_pure_text

            warm_start_pure_text(self)
            self._push_group_states()
            self.check_models_fine_tunable()
        self._push_group_states()
        self.reach_point(iteration, current.value, "start")
        summary: dict[str, Any] = {"iteration": iteration, "stage": current.value}
        began = time.monotonic()
        summary.update(STAGES[current](self))
        summary["seconds"] = round(time.monotonic() - began, 3)
        nxt = next_stage(self.state, self.hyper_params)
        summary["next_iteration"], summary["next_stage"] = nxt.iteration, nxt.stage.value
        # before the state (see stored_stage_summary); a summary written before stands
        summary = self.records.write_summary(iteration, current.value, summary)
        self.state.iteration, self.state.train_loop_stage = nxt
        self.save_state()
        self.log_run_artifact("state", "state", ["state.json", "hyper_params.json"])
        self.reach_point(iteration, current.value, "end")
        self.hooks.on_stage_end(current.value, iteration)
        return summary

    def reach_point(self, iteration: int, stage: str, point: str) -> None:
        """Report a stage point to the hooks (:mod:`nip_core.trainers.hooks`: points)."""
        reach_point(self.hooks, iteration, stage, point)

    def stored_stage_summary(self, iteration: int, stage: str) -> dict[str, Any] | None:
        """The summary ``run_stage`` returned for a completed stage (None if not stored).

        It is written before the state moves past the stage, so a process that died
        between the two leaves a summary of the stage that the state shows as done
        (orchestrators rebuild their view of a recovered stage from it).
        """
        return self.records.stored_summary(iteration, str(stage))

    def train(self) -> None:
        with self.make_iteration_context(self.num_iterations, "iterations") as bar:
            bar.step(min(self.state.iteration, self.num_iterations))
            while self.next_stage().stage is not Stage.DONE:
                before = self.state.iteration
                self.run_stage(self.next_stage().stage)
                if before < self.state.iteration <= self.num_iterations:
                    bar.step(self.state.iteration - before)

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

    # -- sampling and testing ------------------------------------------------------------------

    def _sample_rollouts(self, environment: Any, iteration: int | Literal["test"], use_tqdm: bool = False,
                         tqdm_desc: str = "Sampling rollouts") -> list[NestedArrayDict]:
        """Sample rollouts in ``environment``: training iteration ``iteration``'s, or ``"test"``'s.

        nip's hook, used by the ``sample_rollouts`` stage (``environment`` is
        ``scenario_instance.train_environment``) *and* by the test loop (the test
        environment, ``iteration="test"``), so an override changes both. Training samples
        ``rl.rollouts_per_iteration`` datapoints, those after the previous iterations'; the
        test loop ``rl.num_test_iterations`` times that many (or the whole test set with
        ``text_rl.test_on_whole_dataset``) from the start. The tokens spent are added to the
        state. nipflow returns one :class:`NestedArrayDict` per rollout (nip: one batch).
        ``use_tqdm`` shows a progress bar (where ``settings.show_progress`` allows bars).
        """
        n, hp = self.rollouts_per_iteration, self.hyper_params
        if iteration == "test":
            count = len(environment.dataset) if hp.text_rl.test_on_whole_dataset else n
            tested = self.state.iteration if self._tested_iteration is None else self._tested_iteration
            count, start, tag = count * hp.rl.num_test_iterations, 0, f"test_{tested}"
        else:
            count, start, tag = n, n * iteration, f"train-{iteration}"
        indices = datapoint_indices(hp.seed, len(environment.dataset), start, count)
        seeds = [stable_seed(hp.seed, tag, k, modulus=2**16) for k in range(count)]
        actor = TextActor(environment, self.scenario.whole_agents(), hp.interaction_protocol, hp)
        with self.make_iteration_context(count, f"{tag}: {tqdm_desc[:1].lower()}{tqdm_desc[1:]}",
                                         show_bar=use_tqdm) as ctx:
            rollouts = run_episodes(environment, actor, environment.dataset, indices, seeds,
                                    self.settings.max_concurrent_requests, on_done=ctx.step)
        self.state.tokens_used += actor.tokens
        return rollouts

    def load_rollouts(self, name: str) -> list[NestedArrayDict]:
        """The stored rollouts ``name`` (``"3"``: training rollouts of iteration 3; ``"test_3"``)."""
        return self.records.load_rollouts(name)

    def _get_log_stats(self, rollouts: list[NestedArrayDict], *, train: bool = True) -> dict[str, float]:
        """The statistics of ``rollouts`` to log (nip's hook; test statistics ``test_``-prefixed).

        Called by the ``log_stats`` stage on an iteration's training rollouts and by the test
        loop (``train=False``) on its rollouts. An override should call this one and add to
        the dictionary (MALT adds its tree statistics to the training ones). Test statistics
        add the accuracy by datapoint kind (:func:`accuracy_by_kind`; code validation: by
        mutation) where the test environment has kinds.
        """
        stats = rollout_stats(rollouts, self.agent_names, self.verifier_index, prefix="" if train else "test_")
        if not train and rollouts:
            env = self.scenario.test_environment
            kinds = [env.datapoint_kind(env.dataset[int(r["datapoint_id"][0])]) for r in rollouts]
            stats.update(accuracy_by_kind(rollouts, self.verifier_index, kinds, prefix="test_"))
        return stats

    def should_test(self, iteration: int) -> bool:
        """Whether ``text_rl.test_scheme`` asks for the test loop on the models of ``iteration``."""
        scheme, n = self.hyper_params.text_rl.test_scheme, self.num_iterations
        return {"none": False, "all": True, "last": iteration == n - 1,
                "first_and_last": iteration in (0, n - 1)}[scheme]

    def run_test_loop_at(self, iteration: int) -> dict[str, float]:
        """Test the current models (those of ``iteration``), log and return the statistics.

        The rollouts (:meth:`_sample_rollouts` with ``"test"``) are saved as
        ``test_{iteration}`` (reused when they exist).
        """
        name = f"test_{iteration}"
        if self.records.has_rollouts(name):
            rollouts = self.records.reuse_rollouts(name)
        else:
            self._tested_iteration = iteration
            rollouts = self._sample_rollouts(self.scenario.test_environment, "test", use_tqdm=True,
                                             tqdm_desc="Sampling test rollouts")
            self.records.save_rollouts(name, rollouts)
        stats = self._get_log_stats(rollouts, train=False)
        self.log_stats(stats, iteration, kind="test")
        return stats

    # -- fine-tuning ---------------------------------------------------------------------------

    @property
    def shared_model_groups(self) -> dict[str, Any]:
        """nip's name of the groups (``self.groups``): group name -> ``PureTextSharedModelGroup``."""
        return self.groups

    def _stage_create_fine_tune_jobs(self, rollouts: list[NestedArrayDict]) -> dict[str, str] | None:
        """Create (or adopt) this iteration's fine-tune jobs from ``rollouts``.

        The hook of the ``create_fine_tune_jobs`` stage. The default creates one job per
        shared model group from :meth:`_build_fine_tune_examples`. An override may do as
        nip's guide says — call each group's ``create_supervised_fine_tune_job(rollouts_per_agent,
        guess_replaced_rollouts, job_name)`` or ``create_dpo_fine_tune_job(...)`` and return
        nothing — or create jobs from examples with :meth:`create_group_fine_tune_job` and
        return ``{group: job_id}``. Groups without a job this iteration keep their model.
        """
        return {name: self.create_group_fine_tune_job(name, self._build_fine_tune_examples(name, rollouts))
                for name in self.groups}

    def _build_fine_tune_examples(self, group: str, rollouts: list[NestedArrayDict]) -> list[dict]:
        """The examples of every member of ``group``, from :meth:`agent_fine_tune_examples`."""
        return [e for agent in self.groups[group].agent_names for e in self.agent_fine_tune_examples(agent, rollouts)]

    def agent_fine_tune_examples(self, agent: str, rollouts: list[NestedArrayDict]) -> list[dict]:
        """The fine-tune examples of ``agent`` (SFT chats or DPO pairs) from ``rollouts``."""
        raise NotImplementedError(f"{type(self).__name__} defines no agent_fine_tune_examples")

    def sft_examples(self, agent: str, rollouts: list[NestedArrayDict], replace_guess: bool = False) -> list[dict]:
        """One ``{"messages": ...}`` chat per rollout, ending on ``agent``'s last reply.

        ``replace_guess``: the verifier's decision is replaced by the true label's (a prover
        never decides: refused). Rollouts where ``agent`` said nothing give no example.
        """
        if replace_guess and rollouts and agent not in self.protocol_handler.verifier_names:
            raise ValueError(f"guess-replaced rollouts are for verifiers; {agent} is not one")
        words = self.hyper_params.agent_params(agent).max_response_words
        examples = []
        for rollout in rollouts:
            try:
                messages = fine_tune_messages(self.protocol_handler, self.hyper_params.interaction_protocol, agent,
                                              rollout, words, replace_guess)
            except NoAssistantMessageError:
                continue
            examples.append({"messages": messages})
        return examples

    def dpo_example(self, agent: str, timestep: NestedArrayDict, preferred: Any, non_preferred: Any) -> dict:
        """The DPO example of ``agent`` at episode state ``timestep``: its prompt there and two replies.

        A reply is its text, or a next timestep whose ``agents.raw_message`` holds it.
        """
        index = self.agent_names.index(agent)

        def reply(value: Any) -> list[dict[str, str]]:
            text = value if isinstance(value, str) else value["agents.raw_message"][index]
            return [{"role": "assistant", "content": str(text)}]

        prompt = build_chat_messages(self.protocol_handler, self.hyper_params.interaction_protocol, agent,
                                     history_of(timestep), max_response_words=self.hyper_params.agent_params(
                                         agent).max_response_words, until_round=int(timestep["round"]))
        return {"input": {"messages": prompt}, "preferred_output": reply(preferred),
                "non_preferred_output": reply(non_preferred)}

    def _get_fine_tune_job_name(self, shared_model_group: Any) -> str:
        """nip's job name: ``{run_id}_iter_{iteration}_{group}`` (the job's suffix)."""
        return f"{self.run_id}_iter_{self.state.iteration}_{shared_model_group.group_name}"

    def create_group_fine_tune_job(self, group: str, examples: list[dict], method: str | None = None,
                                   job_name: str | None = None) -> str:
        """Create (or adopt) ``group``'s job of this iteration; its id.

        ``method``: ``"supervised"`` or ``"dpo"`` (default the trainer's ``fine_tune_method``);
        ``job_name``: the job's suffix (default :meth:`_get_fine_tune_job_name`). The job id is
        saved in the state before the next group's call.
        """
        i, g = self.state.iteration, self.groups[group]
        job_id = g.create_job_from_examples(examples, method or self.fine_tune_method, run=self.run,
                                            run_id=self.run_id, iteration=i,
                                            job_name=job_name or self._get_fine_tune_job_name(g),
                                            seed=stable_seed(self.hyper_params.seed, i, group, modulus=2**31))
        self.save_state()
        self.reach_point(i, Stage.CREATE_FINE_TUNE_JOBS.value, f"after_{group}")
        return job_id

    def groups_with_jobs(self) -> dict[str, Any]:
        """The groups that have a fine-tune job of the current iteration."""
        return {n: g for n, g in self.groups.items() if g.state.fine_tune_job_id is not None}

    def poll_fine_tune_jobs(self) -> dict[str, str]:
        """Non-blocking status of every job of the current iteration (``{}`` outside the await stage)."""
        self._push_group_states()
        if self.state.train_loop_stage is not Stage.AWAIT_FINE_TUNE_JOBS:
            return {}
        self.waiter.groups = self.groups_with_jobs()
        return self.waiter.poll()

    def run_await_stage(self, block: bool) -> dict[str, Any]:
        """Wait for the jobs (backoff, bounded by ``fine_tune_wait_timeout_s``); the statuses.

        Raises
        ------
        FineTuneJobsPending
            If ``block`` is false and a job is still going.
        """
        if self.state.train_loop_stage is not Stage.AWAIT_FINE_TUNE_JOBS:
            return {}
        self.waiter.groups = self.groups_with_jobs()
        if not block:
            return self.waiter.wait(self.state.iteration, block=False)
        with self.make_iteration_context(len(self.waiter.groups), f"it {self.state.iteration}: fine-tune jobs") as bar:
            return self.waiter.wait(self.state.iteration, block=True, bar=bar)

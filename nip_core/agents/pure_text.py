"""Text agents behind an OpenAI-compatible API, and the shared model groups that fine-tune them.

``PureTextWholeAgent`` generates one agent's reply for an episode state (prompt building
and parsing come from :mod:`nip_core.scenarios.code_validation.text_protocols`).
``PureTextSharedModelGroup`` owns the model a set of agents share and creates its
fine-tune jobs. A job is created exactly once per intent (run incarnation, iteration,
group, attempt), whatever fails in between: the job carries that intent as ``metadata``
and its training file a deterministic name (incarnation, iteration, group, content hash);
both are looked up before every create request and after every failed one (see
:mod:`nip_core.llm.remote_objects`). File and job ids are recorded in the run store
(``fine_tune/iter_{i}_{group}.json``) right after each call. A job that fails or is
cancelled is retried as a new attempt up to ``text_rl.fine_tune_max_attempts`` times.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

from pydantic import BaseModel

from nip_core.errors import FineTuneJobFailed
from nip_core.llm import remote_objects as remote
from nip_core.llm.capabilities import offers_structured_output
from nip_core.llm.job_status import STATUS_MAP
from nip_core.llm.remote_objects import find_jobs

log = logging.getLogger(__name__)

FROZEN_JOB_ID = "frozen_job_id"
INSUFFICIENT_DATA_JOB_ID = "insufficient_data_job_id"
MIN_FINE_TUNE_EXAMPLES = 10
MAX_SUFFIX = 64
#: The decision lines the text protocols' prompts ask for (read back by their parsers); a
#: constrained decision turn (``guided_choice``) may answer only these.
DECISION_CHOICES = ("Decision: accept", "Decision: reject")


def incarnation_of(run: Any) -> str:
    """The run store entry's incarnation id (``"none"`` without a run store)."""
    return run.incarnation if run is not None else "none"


def _error_repr(err: Any) -> str:
    if err is None:
        return "Code: None. Message: None."
    out = f"Code: {err.code}. Message: {err.message}."
    if getattr(err, "param", None):
        out += f" Parameter: {err.param}."
    return out


@dataclass(frozen=True)
class FineTuneBinding:
    """What nip's rollout-form fine-tune methods of a group need from the trainer that owns it.

    ``submit(group, examples, method, job_name)`` creates (or adopts) the group's job of the
    trainer's current iteration and saves the trainer state; ``sft_examples(agent, rollouts,
    replace_guess)`` and ``dpo_example(agent, timestep, preferred, non_preferred)`` turn
    rollouts into the API's examples (prompts are the scenario's, which this layer does not know).
    """

    submit: Callable[[str, list[dict[str, Any]], str, "str | None"], str]
    sft_examples: Callable[[str, list[Any], bool], list[dict[str, Any]]]
    dpo_example: Callable[[str, Any, Any, Any], dict[str, Any]]


class PureTextSharedModelGroupState(BaseModel):
    """Persistent state of a group (saved in the trainer state)."""

    fine_tune_job_id: str | None = None
    fine_tune_attempt: int = 1  # of the current job (a failed or cancelled job is retried)
    fine_tuned_model_name: str | None = None
    last_status: str | None = None  # of the job, when it was last polled


def _note_duplicates(record: dict[str, Any], cancelled: list[str]) -> None:
    """Keep the ids of duplicate jobs that were cancelled in the fine-tune record."""
    if cancelled:
        record["cancelled_duplicates"] = sorted(set(record.get("cancelled_duplicates", [])) | set(cancelled))


class PureTextWholeAgent:
    """Calls chat completions for one agent; the scenario instance holds it in ``Agent.whole``.

    Parameters
    ----------
    name
        Agent name (as in the protocol).
    params
        The agent's ``CodeValidationAgentParameters``.
    client_factory
        Returns the (shared, thread-safe) ``openai.OpenAI`` client.
    model_name
        Returns the model currently used (the group's fine-tuned model or the base one).
    """

    def __init__(self, name: str, params: Any, client_factory: Callable[[], Any], model_name: Callable[[], str]):
        self.name = name
        self.params = params
        self._client = client_factory
        self._model_name = model_name
        self._structured: dict[str, bool] = {}  # model -> the server offers structured output

    def _constrain_decisions(self, model: str) -> bool:
        setting = getattr(self.params, "decision_constraint", "off")
        if setting != "auto":
            return setting == "on"
        if model not in self._structured:  # one models.retrieve per model (a fine-tune is a new one)
            self._structured[model] = offers_structured_output(self._client(), model)
        return self._structured[model]

    def generate(self, messages: list[dict[str, str]], seed: int | None = None, *,
                 decision: bool = False, form: str | None = None) -> tuple[str, str, int]:
        """One completion: ``(content, finish_reason, total_tokens)``.

        ``seed`` makes the sampling reproducible where the API supports it. ``decision``: the
        reply must be a decision (a verifier's last round); with the agent's
        ``decision_constraint`` on, the API is asked to hold it to ``Decision: accept`` or
        ``Decision: reject`` (``guided_choice``). ``form``: the regular expression of a valid
        reply in the other rounds (a verifier's questions), held to in the same way
        (``guided_regex``). Rate limits (429 with ``Retry-After``) and connection errors are retried by the
        openai client itself.
        """
        p = self.params
        kwargs: dict[str, Any] = {"model": self._model_name(), "messages": messages,
                                  "max_tokens": p.max_tokens_per_message or int(1.5 * p.max_response_words)}
        if seed is not None:
            kwargs["seed"] = seed
        if p.temperature is not None:
            kwargs["temperature"] = p.temperature
        if p.top_p is not None:
            kwargs["top_p"] = p.top_p
        if (decision or form) and self._constrain_decisions(kwargs["model"]):
            kwargs["extra_body"] = {"guided_choice": list(DECISION_CHOICES)} if decision else {"guided_regex": form}
        resp = self._client().chat.completions.create(**kwargs)
        choice = resp.choices[0]
        tokens = int(getattr(resp.usage, "total_tokens", 0) or 0) if resp.usage is not None else 0
        return choice.message.content or "", choice.finish_reason or "stop", tokens


class PureTextSharedModelGroup:
    """The model shared by ``agent_names``, with its fine-tune jobs.

    Parameters
    ----------
    group_name
        Group name (used in job metadata and suffix).
    agent_names
        Member agents.
    params
        Parameters of the members (must agree on model, freezing, from-scratch).
    client_factory
        Returns the ``openai.OpenAI`` client.
    max_attempts
        Jobs per (iteration, group) before a failed or cancelled job fails the run
        (``text_rl.fine_tune_max_attempts``).
    n_epochs
        The jobs' ``n_epochs`` hyperparameter, or ``"auto"`` (the API's choice;
        ``text_rl.fine_tune_n_epochs``).
    """

    def __init__(self, group_name: str, agent_names: list[str], params: Any, client_factory: Callable[[], Any],
                 max_attempts: int = 3, n_epochs: int | str = "auto"):
        self.group_name = group_name
        self.max_attempts = max_attempts
        self.n_epochs = n_epochs
        self.agent_names = list(agent_names)
        self.params = params
        self._client = client_factory
        self.state = PureTextSharedModelGroupState()
        self.binding: FineTuneBinding | None = None

    @property
    def model_name(self) -> str:
        return self.state.fine_tuned_model_name or self.params.model_name

    @property
    def frozen(self) -> bool:
        return bool(self.params.freeze_agent)

    # -- job creation ---------------------------------------------------------------------

    def _record_path(self, iteration: int) -> str:
        return f"fine_tune/iter_{iteration}_{self.group_name}.json"

    def bind(self, binding: "FineTuneBinding") -> None:
        """Attach the trainer that owns this group (nip's rollout-form methods need it)."""
        self.binding = binding

    def _bound(self, method: str) -> "FineTuneBinding":
        binding = self.binding
        if binding is None:
            raise RuntimeError(f"group {self.group_name}: {method} takes rollouts, which needs the trainer that "
                               "owns the group (PureTextRlTrainer binds its groups); without one, use "
                               "create_job_from_examples")
        return binding

    def _members(self, per_agent: dict[str, Any], argument: str) -> dict[str, list[Any]]:
        strangers = sorted(set(per_agent) - set(self.agent_names))
        if strangers:
            raise ValueError(f"{argument}: {', '.join(strangers)} not in group {self.group_name} "
                             f"({', '.join(self.agent_names)})")
        return {agent: list(items) for agent, items in per_agent.items()}

    def create_supervised_fine_tune_job(self, rollouts_per_agent: dict[str, Any],
                                        guess_replaced_rollouts: dict[str, Any] | None = None,
                                        job_name: str | None = None) -> str:
        """Create (or adopt) the group's supervised job of the current iteration from rollouts (nip's form).

        Parameters
        ----------
        rollouts_per_agent
            Member agent -> its rollouts to learn from (a list of rollouts, each a
            ``NestedArrayDict``; nip passes one batch): each gives one chat example, the
            whole rollout up to the agent's last reply.
        guess_replaced_rollouts
            Verifier -> rollouts whose decision is replaced by the true label's.
        job_name
            The job's suffix (default: :meth:`PureTextRlTrainer._get_fine_tune_job_name`).

        Returns the job id (also in ``state.fine_tune_job_id``; the trainer state is saved).
        """
        binding = self._bound("create_supervised_fine_tune_job")
        examples = []
        for agent, rollouts in self._members(rollouts_per_agent, "rollouts_per_agent").items():
            examples += binding.sft_examples(agent, rollouts, False)
        for agent, rollouts in self._members(guess_replaced_rollouts or {}, "guess_replaced_rollouts").items():
            examples += binding.sft_examples(agent, rollouts, True)
        return binding.submit(self.group_name, examples, "supervised", job_name)

    def create_dpo_fine_tune_job(self, timesteps_per_agent: dict[str, Any],
                                 positive_examples_per_agent: dict[str, Any],
                                 negative_examples_per_agent: dict[str, Any], job_name: str | None = None) -> str:
        """Create (or adopt) the group's DPO job of the current iteration from timesteps (nip's form).

        ``timesteps_per_agent[agent][k]`` is an episode state at which ``agent`` replied;
        ``positive_examples_per_agent[agent][k]`` and ``negative_examples_per_agent[agent][k]``
        the preferred and the other reply there: the reply text, or the next timestep (a
        ``NestedArrayDict`` whose ``agents.raw_message`` holds it), as nip passes them.
        """
        binding = self._bound("create_dpo_fine_tune_job")
        timesteps = self._members(timesteps_per_agent, "timesteps_per_agent")
        positive = self._members(positive_examples_per_agent, "positive_examples_per_agent")
        negative = self._members(negative_examples_per_agent, "negative_examples_per_agent")
        examples = []
        for agent, states in timesteps.items():
            good, bad = positive.get(agent, []), negative.get(agent, [])
            if not len(states) == len(good) == len(bad):
                raise ValueError(f"agent {agent}: {len(states)} timesteps, {len(good)} positive and {len(bad)} "
                                 "negative examples; one of each per timestep")
            examples += [binding.dpo_example(agent, s, g, b) for s, g, b in zip(states, good, bad)]
        return binding.submit(self.group_name, examples, "dpo", job_name)

    def create_job_from_examples(self, examples: list[dict[str, Any]], method: str = "supervised", *, run: Any,
                                 run_id: str, iteration: int, seed: int | None = None,
                                 job_name: str | None = None) -> str:
        """Create (or adopt) the job of ``iteration`` from ready examples; return its id.

        ``examples`` are ``{"messages": [...]}`` chats (``method="supervised"``) or
        ``input``/``preferred_output``/``non_preferred_output`` pairs (``"dpo"``); ``seed`` is
        passed to the job so that a rerun trains the same model; ``job_name`` is its suffix
        (default ``{run_id}_iter_{iteration}_{group}``).
        """
        if method not in ("supervised", "dpo"):
            raise ValueError(f"method: 'supervised' or 'dpo', got {method!r}")
        return self._create_job(examples, method, run=run, run_id=run_id, iteration=iteration, seed=seed,
                                job_name=job_name)

    def job_metadata(self, run: Any, run_id: str, iteration: int, attempt: int) -> dict[str, str]:
        """What identifies the job of one intent: the run *incarnation*, iteration, group, attempt.

        The incarnation (a random id given to a run store entry when it is created) keeps
        a run id that was deleted and created again from adopting the old entry's jobs.
        """
        return {"nipflow_run_id": run_id, "nipflow_incarnation": incarnation_of(run),
                "nipflow_iteration": str(iteration), "nipflow_group": self.group_name,
                "nipflow_attempt": str(attempt)}

    def _create_job(self, examples: list[dict[str, Any]], method: str, *, run: Any, run_id: str,
                    iteration: int, seed: int | None = None, job_name: str | None = None) -> str:
        if self.frozen:
            self.state.fine_tune_job_id = FROZEN_JOB_ID
            return FROZEN_JOB_ID
        if len(examples) < MIN_FINE_TUNE_EXAMPLES:
            log.warning("group %s iteration %d: %d examples (< %d); no fine-tune job", self.group_name,
                        iteration, len(examples), MIN_FINE_TUNE_EXAMPLES)
            self.state.fine_tune_job_id = INSUFFICIENT_DATA_JOB_ID
            return INSUFFICIENT_DATA_JOB_ID
        record = self._read_record(run, iteration)
        client = self._client()
        # A job of this intent may exist from an interrupted attempt: adopt it (remote.adopt's rule).
        prior = find_jobs(client, {k: v for k, v in self.job_metadata(run, run_id, iteration, 1).items()
                                   if k != "nipflow_attempt"})
        if prior:
            job, cancelled = remote.adopt(client, prior)
            attempt = int(job.metadata["nipflow_attempt"])
            record.setdefault("file_id", job.training_file)
            record.update(job_id=job.id, attempt=attempt, method=method, seed=seed, base_model=job.model)
            _note_duplicates(record, cancelled)
            self._write_record(run, iteration, record)
            return self._use_job(job.id, attempt)
        data = remote.jsonl_bytes(examples)
        filename = (f"nipflow-{incarnation_of(run)}-it{iteration}-{self.group_name}-"
                    f"{remote.content_hash(data)}.jsonl")
        if record.get("filename") != filename or "file_id" not in record:
            uploaded, _ = remote.upload_file_once(client, filename, data)
            record.update(file_id=uploaded.id, filename=filename)
            self._write_record(run, iteration, record)
        base = self.params.model_name if self.params.fine_tune_from_scratch else self.model_name
        record.update(method=method, seed=seed, base_model=base)
        if job_name:
            record["job_name"] = job_name
        return self._create_attempt(run, run_id, iteration, record, attempt=1)

    def _create_attempt(self, run: Any, run_id: str, iteration: int, record: dict[str, Any], attempt: int) -> str:
        """Create (exactly once) attempt ``attempt`` of the job described by ``record``."""
        if run is not None:
            run.check_lease()
        name = record.get("job_name") or f"{run_id}_iter_{iteration}_{self.group_name}"
        suffix = name[-MAX_SUFFIX:].replace(":", "_")
        extra = {"seed": record["seed"]} if record.get("seed") is not None else {}
        job, created, cancelled = remote.create_job_once(
            self._client(), self.job_metadata(run, run_id, iteration, attempt), model=record["base_model"],
            training_file=record["file_id"], suffix=suffix, method=self._method(record["method"]), **extra)
        if not created:
            log.info("group %s iteration %d: adopted job %s (attempt %d)", self.group_name, iteration, job.id, attempt)
        record.update(job_id=job.id, attempt=attempt)
        _note_duplicates(record, cancelled)
        self._write_record(run, iteration, record)
        return self._use_job(job.id, attempt)

    def _method(self, kind: str) -> dict[str, Any]:
        """The job request's ``method``: its type, and the epochs when they are not the API's choice."""
        if self.n_epochs == "auto":
            return {"type": kind}
        return {"type": kind, kind: {"hyperparameters": {"n_epochs": int(self.n_epochs)}}}

    def _use_job(self, job_id: str, attempt: int) -> str:
        self.state.fine_tune_job_id = job_id
        self.state.fine_tune_attempt = attempt
        self.state.last_status = None
        return job_id

    def retry_failed_job(self, *, run: Any, run_id: str, iteration: int) -> str:
        """After the current job failed or was cancelled: create the next attempt, or give up.

        Each attempt's error is kept in the record. Raises ``FineTuneJobFailed`` listing
        every attempt's error once ``max_attempts`` attempts have ended badly.
        """
        job_id = self.state.fine_tune_job_id
        job = self._client().fine_tuning.jobs.retrieve(job_id)
        record = self._read_record(run, iteration)
        attempts = [a for a in record.get("attempts", []) if a.get("job_id") != job_id]
        attempts.append({"attempt": self.state.fine_tune_attempt, "job_id": job_id, "status": job.status,
                         "error": _error_repr(job.error) if job.status == "failed" else "cancelled"})
        record["attempts"] = attempts
        self._write_record(run, iteration, record)
        if self.state.fine_tune_attempt >= self.max_attempts or "base_model" not in record:
            listed = "; ".join(f"attempt {a['attempt']} ({a['job_id']}) {a['status']}: {a['error']}" for a in attempts)
            raise FineTuneJobFailed(job_id, self.group_name, job.status,
                                    f"{len(attempts)} attempt(s) of {self.max_attempts} ended badly: {listed}")
        log.warning("group %s iteration %d: job %s %s; starting attempt %d of %d", self.group_name, iteration,
                    job_id, job.status, self.state.fine_tune_attempt + 1, self.max_attempts)
        return self._create_attempt(run, run_id, iteration, record, self.state.fine_tune_attempt + 1)

    def _read_record(self, run: Any, iteration: int) -> dict[str, Any]:
        if run is not None and run.exists(self._record_path(iteration)):
            return run.read_json(self._record_path(iteration))
        return {}

    def _write_record(self, run: Any, iteration: int, record: dict[str, Any]) -> None:
        if run is not None:
            run.write_json(self._record_path(iteration), record)

    # -- status ---------------------------------------------------------------------------

    def get_fine_tune_job_status(self) -> str:
        """``succeeded``/``failed``/``cancelled``, or the non-terminal status to wait on.

        ``validating_files`` and ``queued`` read as ``pending``; ``running``, ``paused``
        and any status this code does not know are not terminal and are waited on.
        """
        job_id = self.state.fine_tune_job_id
        if job_id in (FROZEN_JOB_ID, INSUFFICIENT_DATA_JOB_ID):
            self.state.last_status = "succeeded"
            return "succeeded"
        if job_id is None:
            raise ValueError(f"group {self.group_name}: no fine-tune job was created")
        status = self._client().fine_tuning.jobs.retrieve(job_id).status
        if status not in STATUS_MAP and status != self.state.last_status:
            log.warning("fine-tune job %s (group %s): status '%s' is not a known one; waiting on it as "
                        "non-terminal", job_id, self.group_name, status)
        self.state.last_status = STATUS_MAP.get(status, status)
        return self.state.last_status

    def get_fine_tune_job_error_repr(self) -> str:
        job_id = self.state.fine_tune_job_id
        if job_id in (None, FROZEN_JOB_ID, INSUFFICIENT_DATA_JOB_ID):
            raise ValueError(f"group {self.group_name}: job '{job_id}' has no error")
        return _error_repr(self._client().fine_tuning.jobs.retrieve(job_id).error)

    def switch_to_next_model(self) -> None:
        """Use the fine-tuned model of the finished job (frozen: the base model)."""
        job_id = self.state.fine_tune_job_id
        if job_id is None:
            raise ValueError(f"group {self.group_name}: no fine-tune job to switch to")
        if job_id == INSUFFICIENT_DATA_JOB_ID:
            return
        if job_id == FROZEN_JOB_ID:
            self.state.fine_tuned_model_name = None
            return
        job = self._client().fine_tuning.jobs.retrieve(job_id)
        if job.status != "succeeded" or not job.fine_tuned_model:
            raise FineTuneJobFailed(job_id, self.group_name, job.status, "no fine-tuned model")
        self.state.fine_tuned_model_name = job.fine_tuned_model

    def trained_tokens(self) -> int:
        job_id = self.state.fine_tune_job_id
        if job_id in (None, FROZEN_JOB_ID, INSUFFICIENT_DATA_JOB_ID):
            return 0
        return int(self._client().fine_tuning.jobs.retrieve(job_id).trained_tokens or 0)

    def job_seconds(self) -> float | None:
        """Seconds from the creation of the group's job to its end (None: no job, or not ended)."""
        job_id = self.state.fine_tune_job_id
        if job_id in (None, FROZEN_JOB_ID, INSUFFICIENT_DATA_JOB_ID):
            return None
        job = self._client().fine_tuning.jobs.retrieve(job_id)
        if not job.finished_at or not job.created_at:
            return None
        return float(max(job.finished_at - job.created_at, 0))

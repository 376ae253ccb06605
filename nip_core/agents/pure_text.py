"""Text agents behind an OpenAI-compatible API, and the shared model groups that fine-tune them.

``PureTextWholeAgent`` generates one agent's reply for an episode state (prompt building
and parsing come from :mod:`nip_core.scenarios.code_validation.text_protocols`).
``PureTextSharedModelGroup`` owns the model a set of agents share and creates its
fine-tune jobs. Job creation is idempotent per (run id, iteration, group): the job
carries that triple as ``metadata``; before uploading or creating, a job with the same
metadata is adopted; the file id and job id are recorded in the run store
(``fine_tune/iter_{i}_{group}.json``) right after each API call, and a recorded file id
is reused instead of uploading again.
"""

from __future__ import annotations

import io
import json
import logging
from typing import Any, Callable

from pydantic import BaseModel

from nip_core.errors import FineTuneJobFailed

log = logging.getLogger(__name__)

FROZEN_JOB_ID = "frozen_job_id"
INSUFFICIENT_DATA_JOB_ID = "insufficient_data_job_id"
MIN_FINE_TUNE_EXAMPLES = 10
MAX_SUFFIX = 64
STATUS_MAP = {"validating_files": "pending", "queued": "pending", "running": "running",
              "succeeded": "succeeded", "failed": "failed", "cancelled": "cancelled"}


class UnknownJobStatusError(ValueError):
    """The API reported a fine-tune status this code does not know."""


class PureTextSharedModelGroupState(BaseModel):
    """Persistent state of a group (saved in the trainer state)."""

    fine_tune_job_id: str | None = None
    fine_tuned_model_name: str | None = None
    last_status: str | None = None  # of the job, when it was last polled


class PureTextWholeAgent:
    """Calls chat completions for one agent.

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

    def generate(self, messages: list[dict[str, str]], seed: int | None = None) -> tuple[str, str, int]:
        """One completion: ``(content, finish_reason, total_tokens)``.

        ``seed`` makes the sampling reproducible where the API supports it. Rate limits (429 with ``Retry-After``) and connection errors are retried by the
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
    """

    def __init__(self, group_name: str, agent_names: list[str], params: Any, client_factory: Callable[[], Any]):
        self.group_name = group_name
        self.agent_names = list(agent_names)
        self.params = params
        self._client = client_factory
        self.state = PureTextSharedModelGroupState()

    @property
    def model_name(self) -> str:
        return self.state.fine_tuned_model_name or self.params.model_name

    @property
    def frozen(self) -> bool:
        return bool(self.params.freeze_agent)

    # -- job creation ---------------------------------------------------------------------

    def _record_path(self, iteration: int) -> str:
        return f"fine_tune/iter_{iteration}_{self.group_name}.json"

    def create_supervised_fine_tune_job(self, examples: list[dict[str, Any]], *, run: Any, run_id: str,
                                        iteration: int, seed: int | None = None) -> str:
        """Create (or adopt) the SFT job of this group for ``iteration``; return its id.

        ``examples`` are ``{"messages": [...]}`` chat examples; ``seed`` is passed to the
        job so that a rerun trains the same model.
        """
        return self._create_job(examples, "supervised", run=run, run_id=run_id, iteration=iteration, seed=seed)

    def create_dpo_fine_tune_job(self, examples: list[dict[str, Any]], *, run: Any, run_id: str,
                                 iteration: int, seed: int | None = None) -> str:
        """Create (or adopt) the DPO job; ``examples`` hold ``input``/``preferred_output``/``non_preferred_output``."""
        return self._create_job(examples, "dpo", run=run, run_id=run_id, iteration=iteration, seed=seed)

    def _create_job(self, examples: list[dict[str, Any]], method: str, *, run: Any, run_id: str,
                    iteration: int, seed: int | None = None) -> str:
        if self.frozen:
            self.state.fine_tune_job_id = FROZEN_JOB_ID
            return FROZEN_JOB_ID
        if len(examples) < MIN_FINE_TUNE_EXAMPLES:
            log.warning("group %s iteration %d: %d examples (< %d); no fine-tune job", self.group_name,
                        iteration, len(examples), MIN_FINE_TUNE_EXAMPLES)
            self.state.fine_tune_job_id = INSUFFICIENT_DATA_JOB_ID
            return INSUFFICIENT_DATA_JOB_ID
        client = self._client()
        metadata = {"nipflow_run_id": run_id, "nipflow_iteration": str(iteration), "nipflow_group": self.group_name}
        record: dict[str, Any] = {}
        if run is not None and run.exists(self._record_path(iteration)):
            record = run.read_json(self._record_path(iteration))
        existing = [j for j in client.fine_tuning.jobs.list(metadata=metadata, limit=100).data
                    if (j.metadata or {}) == metadata]
        if existing:
            job_id = existing[0].id
        else:
            file_id = record.get("file_id")
            if file_id is None:
                data = "".join(json.dumps(e) + "\n" for e in examples).encode()
                f = client.files.create(file=(f"{self.group_name}_{iteration}.jsonl", io.BytesIO(data)),
                                        purpose="fine-tune")
                file_id = f.id
                record["file_id"] = file_id
                self._write_record(run, iteration, record)
            self._before_create_hook(iteration)
            base = self.params.model_name if self.params.fine_tune_from_scratch else self.model_name
            suffix = f"{run_id}_iter_{iteration}_{self.group_name}"[-MAX_SUFFIX:].replace(":", "_")
            extra = {"seed": seed} if seed is not None else {}
            job = client.fine_tuning.jobs.create(model=base, training_file=file_id, suffix=suffix,
                                                 method={"type": method}, metadata=metadata, **extra)
            job_id = job.id
        record["job_id"] = job_id
        self._write_record(run, iteration, record)
        self.state.fine_tune_job_id = job_id
        self.state.last_status = None
        return job_id

    def _before_create_hook(self, iteration: int) -> None:
        """Test seam: called between the recorded upload and the job creation."""

    def _write_record(self, run: Any, iteration: int, record: dict[str, Any]) -> None:
        if run is not None:
            run.write_json(self._record_path(iteration), record)

    # -- status ---------------------------------------------------------------------------

    def get_fine_tune_job_status(self) -> str:
        """``pending``/``running``/``succeeded``/``failed``/``cancelled``."""
        job_id = self.state.fine_tune_job_id
        if job_id in (FROZEN_JOB_ID, INSUFFICIENT_DATA_JOB_ID):
            self.state.last_status = "succeeded"
            return "succeeded"
        if job_id is None:
            raise ValueError(f"group {self.group_name}: no fine-tune job was created")
        status = self._client().fine_tuning.jobs.retrieve(job_id).status
        if status not in STATUS_MAP:
            raise UnknownJobStatusError(f"fine-tune job {job_id} (group {self.group_name}): status '{status}'")
        self.state.last_status = STATUS_MAP[status]
        return self.state.last_status

    def get_fine_tune_job_error_repr(self) -> str:
        job_id = self.state.fine_tune_job_id
        if job_id in (None, FROZEN_JOB_ID, INSUFFICIENT_DATA_JOB_ID):
            raise ValueError(f"group {self.group_name}: job '{job_id}' has no error")
        err = self._client().fine_tuning.jobs.retrieve(job_id).error
        if err is None:
            return "Code: None. Message: None."
        out = f"Code: {err.code}. Message: {err.message}."
        if getattr(err, "param", None):
            out += f" Parameter: {err.param}."
        return out

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

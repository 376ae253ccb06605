"""Fine-tuning jobs: the lifecycle run by background worker threads, and recovery.

``validating_files`` (the files are parsed and checked for the method) -> ``queued`` ->
``running`` (real training by the server's engine, :meth:`Engine.train`) ->
``succeeded`` | ``failed`` | ``cancelled``. Phases are paced by the server's
``job_time_scale`` (see :mod:`~nipflow_llm_server.server.config`). Every transition, event and
checkpoint is committed to the store as it happens.

After a restart (clean or not), :meth:`JobManager.recover` picks up every job that is
not terminal: jobs still validating or queued continue where they were; a job that was
running restarts its training from the beginning (training is deterministic given the
job's seed, so the result is the same), at most ``max_job_attempts`` times in all, after
which it fails with ``server_error``. A job is never left running with nobody working on it.
"""

from __future__ import annotations

import csv
import io
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from nipflow_llm_server.engines.base import StepMetrics, TrainingCancelled
from nipflow_llm_server.server.config import QUEUED_S, RUNNING_MIN_S, VALIDATING_S, ServerConfig
from nipflow_llm_server.server.errors import ApiError, invalid_request, not_found
from nipflow_llm_server.server.files import FileService
from nipflow_llm_server.server.records import CheckpointRecord, EventRecord, JobError, JobRecord, new_id, now
from nipflow_llm_server.server.registry import ModelRegistry, UnknownModelError
from nipflow_llm_server.server.store import Store
from nipflow_llm_server.server.validation import TrainingFileError, training_examples

log = logging.getLogger(__name__)
MAX_METRIC_EVENTS = 50


class _Stopping(Exception):
    """The server is shutting down; the job stays as persisted for the next start."""


def fine_tuned_name(job: JobRecord, base: str, organization: str) -> str:
    """``ft:{base}:{org}:{suffix}:{id}``, the id being 8 characters of the job id."""
    return f"ft:{base}:{organization}:{job.user_provided_suffix or ''}:{job.id.split('-', 1)[1][:8]}"


class JobManager:
    """Runs jobs on ``config.job_workers`` threads (see the module docstring)."""

    def __init__(self, config: ServerConfig, store: Store, files: FileService, registry: ModelRegistry):
        self.config = config
        self.store = store
        self.files = files
        self.registry = registry
        self.engine = registry.engine
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._stop = threading.Event()
        self._cancelled: set[str] = set()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    # -- control ---------------------------------------------------------------------------

    def start(self) -> None:
        self.recover()
        for i in range(self.config.job_workers):
            thread = threading.Thread(target=self._worker, name=f"ft-worker-{i}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        for _ in self._threads:
            self._queue.put(None)
        for thread in self._threads:
            thread.join(timeout)

    def submit(self, job_id: str) -> None:
        self._queue.put(job_id)

    def event(self, job_id: str, message: str, level: str = "info", data: dict | None = None, type: str = "message") -> None:
        self.store.add_event(
            job_id, EventRecord(id=new_id("ftevent-"), created_at=now(), level=level, message=message, data=data, type=type)
        )

    def _update(self, job_id: str, change: Callable[[JobRecord], None]) -> JobRecord | None:
        """Apply ``change`` to a job that is not terminal and save it; else ``None``."""
        with self._lock:
            job = self.store.get_job(job_id)
            if job is None or job.terminal:
                return None
            change(job)
            self.store.save_job(job)
            return job

    def cancel(self, job_id: str) -> JobRecord:
        """Cancel a job now (400 if it already finished)."""
        with self._lock:
            job = self.store.get_job(job_id)
            if job is None:
                raise not_found(f"No fine-tuning job found with id {job_id}", param="fine_tuning_job_id")
            if job.terminal:
                raise invalid_request(f"Job {job_id} has already {job.status}; it cannot be cancelled", param="fine_tuning_job_id")
            self.store.request_cancel(job_id)
            self._cancelled.add(job_id)
            job.status = "cancelled"
            job.finished_at = now()
            job.estimated_finish = None
            self.store.save_job(job)
        self.event(job_id, "Fine-tuning job cancelled")
        return job

    def fail(self, job_id: str, code: str, message: str, param: str | None = None) -> None:
        def change(job: JobRecord) -> None:
            job.status = "failed"
            job.error = JobError(code=code, message=message, param=param)
            job.finished_at = now()
            job.estimated_finish = None

        if self._update(job_id, change) is not None:
            self.event(job_id, f"Fine-tuning job failed: {message}", level="error")

    def recover(self) -> None:
        """Resume or fail the jobs a previous server process left unfinished."""
        for job in self.store.jobs_with_status(("validating_files", "queued", "running")):
            if self.store.cancel_requested(job.id):
                self._update(job.id, lambda j: setattr(j, "status", "cancelled"))
                continue
            if job.status == "running":
                attempts = self.store.job_attempts(job.id)
                if attempts >= self.config.max_job_attempts:
                    self.fail(job.id, "server_error", f"the server stopped {attempts} times while this job was running")
                    continue
                self.store.delete_checkpoints(job.id)
                self.event(
                    job.id,
                    "The server restarted while the job was running; training restarts from the beginning "
                    f"(attempt {attempts + 1} of {self.config.max_job_attempts})",
                    level="warn",
                )
            else:
                self.event(job.id, f"The server restarted; the job continues ({job.status})")
            self.submit(job.id)

    # -- the worker ------------------------------------------------------------------------

    def _worker(self) -> None:
        while not self._stop.is_set():
            job_id = self._queue.get()
            if job_id is None:
                return
            try:
                self._run(job_id)
            except _Stopping:
                return
            except Exception as exc:  # a bug must fail the job, not kill the worker
                log.exception("fine-tuning job %s crashed", job_id)
                self.fail(job_id, "server_error", f"internal error: {type(exc).__name__}: {exc}")

    def _sleep(self, seconds: float, job_id: str) -> None:
        deadline = time.monotonic() + seconds
        while True:
            if self._stop.is_set():
                raise _Stopping()
            if job_id in self._cancelled:
                raise TrainingCancelled()
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._stop.wait(min(left, 0.05))

    def _examples(self, job: JobRecord) -> tuple[list[dict], list[dict]]:
        method = job.method["type"]
        train_ex = training_examples(self.files.content(job.training_file), method)
        valid_ex = []
        if job.validation_file:
            valid_ex = training_examples(self.files.content(job.validation_file), method, role="validation")
        return train_ex, valid_ex

    def _run(self, job_id: str) -> None:
        job = self.store.get_job(job_id)
        if job is None or job.terminal:
            return
        scale = self.config.job_time_scale
        try:
            if job.status == "validating_files":
                self.event(job_id, f"Validating training file: {job.training_file}")
                self._sleep(VALIDATING_S * scale, job_id)
                train_ex, _ = self._examples(job)
                cfg = self.engine.resolve_hyperparameters(job.method["type"], len(train_ex), _given(job), job.seed)
                if self._update(job_id, lambda j: _to_queued(j, cfg)) is None:
                    return
                self.event(job_id, "Files validated, moving job to queued state")
            if self.store.get_job(job_id).status == "queued":
                self._sleep(QUEUED_S * scale, job_id)
                if self._update(job_id, lambda j: _to_running(j, RUNNING_MIN_S * scale)) is None:
                    return
                self.event(job_id, "Fine-tuning job started")
            self.store.add_attempt(job_id)
            self._train(job_id)
        except TrainingCancelled:
            return
        except TrainingFileError as exc:
            self.fail(job_id, exc.code, str(exc), param="training_file")
        except UnknownModelError as exc:
            self.fail(job_id, "model_not_found", f"model {exc.args[0]} no longer exists", param="model")
        except ApiError as exc:  # a training or validation file deleted since the job was created
            self.fail(job_id, "invalid_training_file", exc.message, param="training_file")

    def _train(self, job_id: str) -> None:
        job = self.store.get_job(job_id)
        train_ex, valid_ex = self._examples(job)
        cfg = self.engine.resolve_hyperparameters(job.method["type"], len(train_ex), _given(job), job.seed)
        parent = self.registry.get(job.model)
        base = self.registry.base_of(job.model)
        name = fine_tuned_name(job, base, self.config.organization)
        budget = RUNNING_MIN_S * self.config.job_time_scale
        started = time.monotonic()
        rows: list[StepMetrics] = []

        def on_step(metrics: StepMetrics, total: int) -> None:
            if self._stop.is_set():
                raise _Stopping()
            if job_id in self._cancelled:
                raise TrainingCancelled()
            rows.append(metrics)
            every = max(1, total // MAX_METRIC_EVENTS)
            if metrics.step % every == 0 or metrics.step == total:
                self.event(
                    job_id,
                    f"Step {metrics.step}/{total}: training loss={metrics.train_loss:.4f}",
                    data={
                        "step": metrics.step,
                        "train_loss": metrics.train_loss,
                        "train_mean_token_accuracy": metrics.train_mean_token_accuracy,
                        "total_steps": total,
                    },
                    type="metrics",
                )
            # spread the job's minimum running time over the steps
            self._sleep(started + budget * metrics.step / total - time.monotonic(), job_id)

        def on_checkpoint(metrics: StepMetrics, epoch: int, artifact: Any) -> None:
            ckpt_name = f"{name}:ckpt-step-{metrics.step}"
            self.registry.save(
                ckpt_name, job_id=job_id, parent=job.model, artifact=artifact,
                owned_by=self.config.organization, listed=False, file_stem=f"ckpt-step-{metrics.step}",
            )
            self.store.add_checkpoint(
                CheckpointRecord(
                    id=new_id("ftckpt-"), created_at=now(), fine_tuned_model_checkpoint=ckpt_name,
                    fine_tuning_job_id=job_id, step_number=metrics.step,
                    metrics={
                        "step": float(metrics.step),
                        "train_loss": metrics.train_loss,
                        "train_mean_token_accuracy": metrics.train_mean_token_accuracy,
                        "full_valid_loss": metrics.valid_loss,
                        "full_valid_mean_token_accuracy": metrics.valid_mean_token_accuracy,
                    },
                )
            )
            self.event(job_id, f"Checkpoint created at step {metrics.step}")

        result = self.engine.train(parent, cfg, train_ex, valid_ex, on_step=on_step, on_checkpoint=on_checkpoint)
        self.registry.save(
            name, job_id=job_id, parent=job.model, artifact=result.artifact,
            owned_by=self.config.organization, listed=False, file_stem="final",
        )
        results_file = self.files.create(
            "step_metrics.csv", "fine-tune-results", _metrics_csv(rows), file_id=f"file-{job_id.split('-', 1)[1]}", check=False
        )

        def succeed(j: JobRecord) -> None:
            j.status = "succeeded"
            j.fine_tuned_model = name
            j.trained_tokens = result.trained_tokens
            j.finished_at = now()
            j.estimated_finish = None
            j.result_files = [results_file.id]

        with self._lock:
            current = self.store.get_job(job_id)
            if current is None or current.terminal:
                self.registry.delete(name)
                return
            record = self.store.get_model(name)
            record.listed = True
            self.store.add_model(record)
            succeed(current)
            self.store.save_job(current)
        self.event(job_id, f"New fine-tuned model created: {name}")
        self.event(job_id, "The job has successfully completed")


def _given(job: JobRecord) -> dict:
    method = job.method.get(job.method["type"]) or {}
    given = dict(job.hyperparameters)
    given.update({k: v for k, v in (method.get("hyperparameters") or {}).items() if v is not None})
    return given


def _to_queued(job: JobRecord, cfg) -> None:
    job.status = "queued"
    resolved = {"n_epochs": cfg.n_epochs, "batch_size": cfg.batch_size, "learning_rate_multiplier": cfg.learning_rate_multiplier}
    job.hyperparameters = dict(resolved)
    kind = job.method["type"]
    if kind == "dpo":
        resolved["beta"] = cfg.beta
    job.method = {"type": kind, kind: {"hyperparameters": resolved}}


def _to_running(job: JobRecord, budget_s: float) -> None:
    job.status = "running"
    job.estimated_finish = now() + int(budget_s) + 1


def _metrics_csv(rows: list[StepMetrics]) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["step", "train_loss", "train_accuracy", "valid_loss", "valid_mean_token_accuracy"])
    for r in rows:
        writer.writerow([r.step, f"{r.train_loss:.6f}", f"{r.train_mean_token_accuracy:.6f}", "", ""])
    return out.getvalue().encode("utf-8")

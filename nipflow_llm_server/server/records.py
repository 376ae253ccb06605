"""Persisted records of the local server, in the JSON shapes of the OpenAI API."""

from __future__ import annotations

import secrets
import string
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

_ALPHABET = string.ascii_letters + string.digits


def new_id(prefix: str, length: int = 24) -> str:
    """A random id such as ``ftjob-AbC...`` (OpenAI's id style)."""
    return prefix + "".join(secrets.choice(_ALPHABET) for _ in range(length))


def now() -> int:
    return int(time.time())


class FileRecord(BaseModel):
    """``file`` object."""

    model_config = ConfigDict(extra="ignore")

    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: Literal["uploaded", "processed", "error"] = "processed"
    expires_at: int | None = None
    status_details: str | None = None


class JobError(BaseModel):
    code: str
    message: str
    param: str | None = None


class JobRecord(BaseModel):
    """``fine_tuning.job`` object."""

    model_config = ConfigDict(extra="ignore")

    id: str
    object: Literal["fine_tuning.job"] = "fine_tuning.job"
    created_at: int
    error: JobError | None = None
    fine_tuned_model: str | None = None
    finished_at: int | None = None
    hyperparameters: dict[str, Any]
    model: str
    organization_id: str
    result_files: list[str] = Field(default_factory=list)
    seed: int
    status: Literal["validating_files", "queued", "running", "succeeded", "failed", "cancelled"]
    trained_tokens: int | None = None
    training_file: str
    validation_file: str | None = None
    estimated_finish: int | None = None
    integrations: list[dict[str, Any]] | None = None
    metadata: dict[str, str] | None = None
    method: dict[str, Any]
    user_provided_suffix: str | None = None

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES


TERMINAL_STATUSES = frozenset({"succeeded", "failed", "cancelled"})


class EventRecord(BaseModel):
    """``fine_tuning.job.event`` object."""

    id: str
    object: Literal["fine_tuning.job.event"] = "fine_tuning.job.event"
    created_at: int
    level: Literal["info", "warn", "error"] = "info"
    message: str
    data: dict[str, Any] | None = None
    type: Literal["message", "metrics"] = "message"


class CheckpointRecord(BaseModel):
    """``fine_tuning.job.checkpoint`` object."""

    id: str
    object: Literal["fine_tuning.job.checkpoint"] = "fine_tuning.job.checkpoint"
    created_at: int
    fine_tuned_model_checkpoint: str
    fine_tuning_job_id: str
    metrics: dict[str, float | None]
    step_number: int


class ModelRecord(BaseModel):
    """A fine-tuned model (``model`` object plus where its weights are)."""

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    job_id: str
    parent: str
    base: str
    weights: str  # path relative to the data directory
    memory: str  # path relative to the data directory ("" when the engine keeps none)
    listed: bool = True
    engine: str = "selection"  # the engine that wrote the files (records before engines: selection)

    def public(self) -> dict[str, Any]:
        return {"id": self.id, "object": "model", "created": self.created, "owned_by": self.owned_by}

"""``/v1/fine_tuning/jobs``: create, list (with ``metadata[k]=v`` filter), retrieve,
cancel, events, checkpoints."""

from __future__ import annotations

import re
import secrets
from typing import Any

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict

from nipflow_llm_server.server.errors import invalid_request, not_found
from nipflow_llm_server.server.records import JobRecord, new_id, now
from nipflow_llm_server.server.store import Page, UnknownCursorError

router = APIRouter()
MAX_SUFFIX = 64
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512
_METADATA_PARAM = re.compile(r"^metadata\[(.*)\]$")
_HYPER_KEYS = {
    "supervised": ("n_epochs", "batch_size", "learning_rate_multiplier"),
    "dpo": ("n_epochs", "batch_size", "learning_rate_multiplier", "beta"),
}


class JobCreateRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    training_file: str
    validation_file: str | None = None
    suffix: str | None = None
    seed: int | None = None
    metadata: dict[str, Any] | None = None
    hyperparameters: dict[str, Any] | None = None
    method: dict[str, Any] | None = None
    integrations: list[dict[str, Any]] | None = None


def _check_file(request: Request, file_id: str, param: str) -> None:
    found = request.app.state.store.get_file(file_id)
    if found is None:
        raise invalid_request(f"invalid {param}: {file_id} (no such file)", param=param, code="invalid_file")
    if found[0].purpose != "fine-tune":
        raise invalid_request(
            f"invalid {param}: {file_id} has purpose '{found[0].purpose}', expected 'fine-tune'", param=param, code="invalid_file"
        )


def _check_metadata(metadata: dict[str, Any] | None) -> dict[str, str] | None:
    if metadata is None:
        return None
    if len(metadata) > MAX_METADATA_PAIRS:
        raise invalid_request(f"metadata may hold at most {MAX_METADATA_PAIRS} pairs, got {len(metadata)}", param="metadata")
    for key, value in metadata.items():
        if len(key) > MAX_METADATA_KEY:
            raise invalid_request(f"metadata key '{key[:20]}...' is longer than {MAX_METADATA_KEY} characters", param="metadata")
        if not isinstance(value, str):
            raise invalid_request(f"metadata value of '{key}' must be a string", param="metadata")
        if len(value) > MAX_METADATA_VALUE:
            raise invalid_request(f"metadata value of '{key}' is longer than {MAX_METADATA_VALUE} characters", param="metadata")
    return dict(metadata)


def _check_hyper(kind: str, given: dict[str, Any], param: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in given.items():
        if key not in _HYPER_KEYS[kind]:
            raise invalid_request(f"unknown hyperparameter '{key}' for a {kind} job", param=f"{param}.{key}")
        if value is None or value == "auto":
            out[key] = "auto"
            continue
        ok = {
            "n_epochs": isinstance(value, int) and 1 <= value <= 50,
            "batch_size": isinstance(value, int) and 1 <= value <= 256,
            "learning_rate_multiplier": isinstance(value, (int, float)) and 0 < value <= 10,
            "beta": isinstance(value, (int, float)) and 0 < value <= 2,
        }[key]
        if not ok or isinstance(value, bool):
            raise invalid_request(f"invalid value {value!r} for hyperparameter '{key}'", param=f"{param}.{key}")
        out[key] = value
    return out


def _method(req: JobCreateRequest) -> tuple[str, dict[str, Any]]:
    method = req.method or {"type": "supervised"}
    kind = method.get("type")
    if kind == "reinforcement":
        raise invalid_request("reinforcement fine-tuning is not supported by the local server", param="method.type")
    if kind not in ("supervised", "dpo"):
        raise invalid_request(f"invalid method type {kind!r}; expected 'supervised' or 'dpo'", param="method.type")
    given = dict(((method.get(kind) or {}).get("hyperparameters")) or {})
    if req.hyperparameters:
        if kind != "supervised":
            raise invalid_request("top-level 'hyperparameters' are only for supervised jobs; use method.dpo.hyperparameters", param="hyperparameters")
        given = {**_check_hyper(kind, req.hyperparameters, "hyperparameters"), **given}
    given = _check_hyper(kind, given, f"method.{kind}.hyperparameters")
    full = {key: given.get(key, "auto") for key in _HYPER_KEYS[kind]}
    return kind, full


@router.post("/v1/fine_tuning/jobs")
async def create_job(req: JobCreateRequest, request: Request) -> dict:
    state = request.app.state
    if not state.registry.exists(req.model):
        raise invalid_request(
            f"Model {req.model} is not available for fine-tuning or does not exist.", param="model", code="model_not_available"
        )
    if req.suffix is not None:
        if len(req.suffix) > MAX_SUFFIX:
            raise invalid_request(
                f"suffix must be at most {MAX_SUFFIX} characters long, got {len(req.suffix)}", param="suffix", code="invalid_suffix"
            )
        if ":" in req.suffix or any(ch.isspace() for ch in req.suffix):
            raise invalid_request("suffix may not contain ':' or whitespace", param="suffix", code="invalid_suffix")
    _check_file(request, req.training_file, "training_file")
    if req.validation_file:
        _check_file(request, req.validation_file, "validation_file")
    metadata = _check_metadata(req.metadata)
    kind, hyper = _method(req)
    base = state.registry.base_of(req.model)
    if not state.engine.supports(base, kind):
        raise invalid_request(
            f"Model {req.model} (base {base}) cannot be fine-tuned with method '{kind}' by this server "
            f"(engine {state.engine.name}).", param="method.type", code="model_not_available"
        )
    job = JobRecord(
        id=new_id("ftjob-"),
        created_at=now(),
        hyperparameters={k: v for k, v in hyper.items() if k != "beta"},
        model=req.model,
        organization_id=state.config.organization,
        seed=req.seed if req.seed is not None else secrets.randbelow(2**31),
        status="validating_files",
        training_file=req.training_file,
        validation_file=req.validation_file,
        integrations=req.integrations,
        metadata=metadata,
        method={"type": kind, kind: {"hyperparameters": hyper}},
        user_provided_suffix=req.suffix,
    )
    state.store.add_job(job)
    state.jobs.event(job.id, f"Created fine-tuning job: {job.id}")
    state.jobs.submit(job.id)
    return job.model_dump()


def _metadata_filter(request: Request) -> dict[str, str] | None | bool:
    """``{k: v}`` from ``metadata[k]=v`` params; ``False`` for ``metadata=null``; else None."""
    wanted: dict[str, str] = {}
    for key, value in request.query_params.multi_items():
        match = _METADATA_PARAM.match(key)
        if match:
            wanted[match.group(1)] = value
        elif key == "metadata":
            if value != "null":
                raise invalid_request("use metadata[key]=value to filter by metadata, or metadata=null", param="metadata")
            return False
    return wanted or None


@router.get("/v1/fine_tuning/jobs")
async def list_jobs(request: Request, after: str | None = None, limit: int = Query(20, ge=1, le=100)) -> dict:
    wanted = _metadata_filter(request)
    if wanted is False:
        keep = lambda job: not job.metadata  # noqa: E731
    elif wanted:
        keep = lambda job: job.metadata is not None and all(job.metadata.get(k) == v for k, v in wanted.items())  # noqa: E731
    else:
        keep = None
    try:
        items, more = request.app.state.store.list_jobs(after, limit, keep)
    except UnknownCursorError:
        raise invalid_request(f"No fine-tuning job found with id {after} (after)", param="after") from None
    return Page(data=[j.model_dump() for j in items], has_more=more).body()


def _job(request: Request, job_id: str) -> JobRecord:
    job = request.app.state.store.get_job(job_id)
    if job is None:
        raise not_found(f"No fine-tuning job found with id {job_id}", param="fine_tuning_job_id")
    return job


@router.get("/v1/fine_tuning/jobs/{job_id}")
async def retrieve_job(job_id: str, request: Request) -> dict:
    return _job(request, job_id).model_dump()


@router.post("/v1/fine_tuning/jobs/{job_id}/cancel")
async def cancel_job(job_id: str, request: Request) -> dict:
    return request.app.state.jobs.cancel(job_id).model_dump()


@router.get("/v1/fine_tuning/jobs/{job_id}/events")
async def list_events(job_id: str, request: Request, after: str | None = None, limit: int = Query(20, ge=1, le=1000)) -> dict:
    _job(request, job_id)
    try:
        items, more = request.app.state.store.list_events(job_id, after, limit)
    except UnknownCursorError:
        raise invalid_request(f"No event found with id {after} (after)", param="after") from None
    return Page(data=[e.model_dump() for e in items], has_more=more).body()


@router.get("/v1/fine_tuning/jobs/{job_id}/checkpoints")
async def list_checkpoints(job_id: str, request: Request, after: str | None = None, limit: int = Query(10, ge=1, le=100)) -> dict:
    _job(request, job_id)
    try:
        items, more = request.app.state.store.list_checkpoints(job_id, after, limit)
    except UnknownCursorError:
        raise invalid_request(f"No checkpoint found with id {after} (after)", param="after") from None
    return Page(data=[c.model_dump() for c in items], has_more=more).body()




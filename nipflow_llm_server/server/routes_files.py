"""``/v1/files``: upload (multipart), list, retrieve, content, delete."""

from __future__ import annotations

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from nipflow_llm_server.server.errors import invalid_request
from nipflow_llm_server.server.multipart import MultipartError, parse_form
from nipflow_llm_server.server.store import Page, UnknownCursorError

router = APIRouter()


@router.post("/v1/files")
async def upload_file(request: Request) -> dict:
    body = await request.body()
    try:
        form = parse_form(request.headers.get("content-type", ""), body)
    except MultipartError as exc:
        raise invalid_request(str(exc)) from None
    if "file" not in form:
        raise invalid_request("Missing required parameter: 'file'.", param="file")
    if "purpose" not in form:
        raise invalid_request("Missing required parameter: 'purpose'.", param="purpose")
    purpose = form["purpose"].data.decode("utf-8", "replace").strip()
    upload = form["file"]
    record = request.app.state.files.create(upload.filename or "upload", purpose, upload.data)
    return record.model_dump()


@router.get("/v1/files")
async def list_files(
    request: Request,
    purpose: str | None = None,
    limit: int = Query(10000, ge=1, le=10000),
    order: str = Query("desc", pattern="^(asc|desc)$"),
    after: str | None = None,
) -> dict:
    try:
        items, more = request.app.state.store.list_files(purpose, after, limit, order)
    except UnknownCursorError:
        raise invalid_request(f"No file found with id {after} (after)", param="after") from None
    return Page(data=[f.model_dump() for f in items], has_more=more).body()


@router.get("/v1/files/{file_id}")
async def retrieve_file(file_id: str, request: Request) -> dict:
    return request.app.state.files.get(file_id).model_dump()


@router.get("/v1/files/{file_id}/content")
async def file_content(file_id: str, request: Request) -> Response:
    data = request.app.state.files.content(file_id)
    return Response(content=data, media_type="application/octet-stream")


@router.delete("/v1/files/{file_id}")
async def delete_file(file_id: str, request: Request) -> dict:
    request.app.state.files.delete(file_id)
    return {"id": file_id, "object": "file", "deleted": True}

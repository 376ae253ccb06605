"""``/v1/models``: list, retrieve and delete models."""

from __future__ import annotations

from fastapi import APIRouter, Request

from nipflow_llm_server.server.errors import ApiError, model_not_found
from nipflow_llm_server.server.registry import UnknownModelError

router = APIRouter()


@router.get("/v1/models")
async def list_models(request: Request) -> dict:
    return {"object": "list", "data": request.app.state.registry.list_public()}


@router.get("/v1/models/{model_id:path}")
async def retrieve_model(model_id: str, request: Request) -> dict:
    try:
        return request.app.state.registry.public(model_id)
    except UnknownModelError:
        raise model_not_found(model_id) from None


@router.delete("/v1/models/{model_id:path}")
async def delete_model(model_id: str, request: Request) -> dict:
    if request.app.state.engine.canonical_base(model_id) is not None:
        raise ApiError(403, f"You cannot delete the base model {model_id}.", param="model", code="model_not_deletable")
    if not request.app.state.registry.delete(model_id):
        raise model_not_found(model_id)
    return {"id": model_id, "object": "model", "deleted": True}

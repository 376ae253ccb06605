"""``POST /v1/chat/completions``: request checking, generation by the server's engine, response."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from dataclasses import replace
from typing import Any, Literal, TypeVar

import anyio
from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from nipflow_llm_server.engines.base import ChatResult, ConstraintError, Generation, SamplingParams
from nipflow_llm_server.engines.constraints import parse_constraint
from nipflow_llm_server.server.errors import ApiError, invalid_request, model_not_found
from nipflow_llm_server.server.records import new_id, now
from nipflow_llm_server.server.registry import UnknownModelError

log = logging.getLogger(__name__)
router = APIRouter()
SYSTEM_FINGERPRINT = "fp_nipflow_local"
#: seconds between two looks, while a completion is generated, at whether its client is still there
DISCONNECT_POLL_S = 0.5
T = TypeVar("T")


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None


class ChatCompletionRequest(BaseModel):
    """The fields the local server uses; others (``tools``, penalties...) are ignored."""

    model_config = ConfigDict(extra="allow")

    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    n: int = Field(1, ge=1, le=128)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    seed: int | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    stream: bool | None = None
    # structured output (nipflow_llm_server/engines/constraints.py): OpenAI's field and vLLM's two
    response_format: Any = None
    guided_regex: Any = None
    guided_choice: Any = None


def _check(req: ChatCompletionRequest) -> list[str]:
    if req.stream:
        raise invalid_request("Streaming is not supported by the local server; set stream=false.", param="stream")
    if req.top_logprobs and not req.logprobs:
        raise invalid_request("logprobs must be set to true when top_logprobs is used.", param="top_logprobs")
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if len(stop) > 4:
        raise invalid_request("'stop' accepts at most 4 sequences.", param="stop")
    return stop


def _logprobs(g: Generation) -> dict | None:
    if g.logprobs is None:
        return None
    content = [
        {
            "token": t.token,
            "logprob": t.logprob,
            "bytes": list(t.token.encode("utf-8")),
            "top_logprobs": [{"token": tok, "logprob": lp, "bytes": list(tok.encode("utf-8"))} for tok, lp in t.top],
        }
        for t in g.logprobs
    ]
    return {"content": content, "refusal": None}


def completion_body(req: ChatCompletionRequest, result: ChatResult) -> dict:
    """The ``chat.completion`` object of a request and its generations."""
    generations = result.generations
    prompt_tokens = result.prompt_tokens
    completion_tokens = sum(g.completion_tokens for g in generations)
    return {
        "id": new_id("chatcmpl-", 29),
        "object": "chat.completion",
        "created": now(),
        "model": req.model,
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "service_tier": "default",
        "choices": [
            {
                "index": i,
                "message": {"role": "assistant", "content": g.text, "refusal": None, "annotations": []},
                "finish_reason": g.finish_reason,
                "logprobs": _logprobs(g),
            }
            for i, g in enumerate(generations)
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
                                          "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0},
        },
    }


@router.post("/v1/chat/completions")
async def create_chat_completion(req: ChatCompletionRequest, request: Request) -> dict:
    state = request.app.state
    stop = _check(req)
    messages = [m.model_dump(exclude_none=True) for m in req.messages]
    params = SamplingParams(
        n=req.n,
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        seed=req.seed,
        max_tokens=req.max_completion_tokens or req.max_tokens,
        stop=tuple(stop),
        logprobs=bool(req.logprobs),
        top_logprobs=req.top_logprobs or 0,
    )
    try:
        params = replace(params, constraint=parse_constraint(req.response_format, req.guided_regex, req.guided_choice))
        if params.constraint is not None:
            state.engine.check_constraint(params.constraint)
    except ConstraintError as exc:
        raise invalid_request(str(exc), param=exc.param) from None
    if state.config.latency_ms:
        # sleeping in the event loop lets other requests proceed meanwhile
        await asyncio.sleep(state.config.latency_ms / 1000.0)
    try:
        # loading a model may read the disk: off the event loop
        model = await anyio.to_thread.run_sync(state.registry.get, req.model)
    except UnknownModelError:
        raise model_not_found(req.model) from None
    result = await _while_connected(request, state.engine.chat(model, messages, params))
    return completion_body(req, result)


async def _while_connected(request: Request, work: Awaitable[T]) -> T:
    """``work``'s result; ``work`` is cancelled if the client disconnects first.

    Starlette does not cancel a route whose client has gone (a timed-out client that retries,
    a killed driver), and decoding for nobody takes rows of the batch from everyone else: the
    engine drops the rows of a cancelled request (:mod:`~nipflow_llm_server.engines.batching`).
    The answer to a client that has gone (499, nginx's "client closed request") reaches nobody.
    """
    task = asyncio.ensure_future(work)
    started = time.monotonic()
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                log.warning("chat completion abandoned: its client disconnected after %.1f s", time.monotonic() - started)
                raise ApiError(499, "The client closed the request before its completion was generated.",
                               type="invalid_request_error", code="client_closed_request")
    finally:
        task.cancel()

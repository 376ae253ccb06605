"""The ASGI application: FastAPI routes behind a gateway for health, auth and faults.

The gateway is a plain ASGI wrapper *outside* FastAPI so that it sees uvicorn's own
``send`` (needed to drop a connection) and so that injected faults never reach the
routes. ``GET /health`` is always open; ``/v1`` and ``/admin`` need the Bearer key when
one is configured.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import os
from collections.abc import Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse

from nipflow_llm_server.engines import make_engine
from nipflow_llm_server.server import chat, routes_files, routes_jobs, routes_models
from nipflow_llm_server.server.config import ServerConfig
from nipflow_llm_server.server.errors import error_body, install_error_handlers
from nipflow_llm_server.server.faults import (
    FaultConfig, FaultInjector, discard, drop_connection, endpoint_group, read_request, replay,
)
from nipflow_llm_server.server.files import FileService
from nipflow_llm_server.server.jobs import JobManager
from nipflow_llm_server.server.registry import ModelRegistry
from nipflow_llm_server.server.store import Store

DB_NAME = "state.sqlite3"

admin = APIRouter()


@admin.get("/admin/faults")
async def get_faults(request: Request) -> dict:
    return request.app.state.faults.status()


@admin.post("/admin/faults")
async def set_faults(config: FaultConfig, request: Request) -> dict:
    request.app.state.faults.configure(config)
    return request.app.state.faults.status()


@admin.delete("/admin/faults")
async def clear_faults(request: Request) -> dict:
    request.app.state.faults.configure(FaultConfig())
    return request.app.state.faults.status()


async def _send_json(send, status: int, body: dict, headers: dict[str, str] | None = None) -> None:
    payload = json.dumps(body).encode("utf-8")
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    raw += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": payload})


_FAULT_BODIES = {
    "429": (429, error_body("Rate limit reached (injected fault). Please retry after a short wait.", "requests", None, "rate_limit_exceeded")),
    "500": (500, error_body("The server had an error while processing your request (injected fault).", "server_error")),
    "503": (503, error_body("The engine is currently overloaded, please try again later (injected fault).", "server_error")),
}


def too_large(limit_mb: float) -> dict:
    return error_body(f"Request body too large: the limit is {limit_mb:g} MB (nipflow api-server --max-upload-mb).",
                      "invalid_request_error", "file", "file_too_large")


class BodyTooLarge(Exception):
    """A request body without a length grew past ``--max-upload-mb`` (answered 413)."""

    def __init__(self, limit_mb: float):
        super().__init__(f"request body over {limit_mb:g} MB")
        self.limit_mb = limit_mb


class Gateway:
    """Health check, API key check and fault injection in front of the FastAPI app."""

    def __init__(self, app: FastAPI, config: ServerConfig, faults: FaultInjector):
        self.app = app
        self.config = config
        self.faults = faults
        self._key = config.api_key.get_secret_value().encode("utf-8") if config.api_key else None
        self._late: set[asyncio.Task] = set()  # requests an act-late fault still has to handle
        self._max_body = int(config.max_upload_mb * 1024 * 1024)

    async def __call__(self, scope: dict[str, Any], receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        if path == "/health":
            body = {"status": "ok", "pid": os.getpid(), "data_dir": str(self.config.data_dir.resolve())}
            await _send_json(send, 200, body)
            return
        if self._key is not None and (path.startswith("/v1/") or path.startswith("/admin/")) and not self._authorized(scope):
            await _send_json(
                send, 401,
                error_body("Incorrect API key provided. You can find your API key in the server's configuration.",
                           "invalid_request_error", None, "invalid_api_key"),
            )
            return
        declared = dict(scope.get("headers", ())).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self._max_body:
            await _send_json(send, 413, too_large(self.config.max_upload_mb), {"connection": "close"})
            return
        receive = self._limited(receive)
        group = endpoint_group(path)
        if group is not None:
            fault, delay, rule = self.faults.draw(group, scope.get("method", "GET"))
            if delay:
                await asyncio.sleep(delay)
            if fault in ("429", "500", "503"):
                retry = {"retry-after": f"{rule.retry_after_s:g}", "retry-after-ms": f"{rule.retry_after_s * 1000:g}"}
                status, body = _FAULT_BODIES[fault]
                await _send_json(send, status, body, retry)
                return
            if fault == "lose_response":
                await self.app(scope, receive, discard)  # acted on in full, then the answer is lost
                if not await drop_connection(send):
                    await _send_json(send, 502, error_body("response lost (injected fault)", "server_error"),
                                     {"connection": "close"})
                return
            if fault == "act_late":
                body = await read_request(receive)
                if not await drop_connection(send):
                    await _send_json(send, 502, error_body("response lost (injected fault)", "server_error"),
                                     {"connection": "close"})
                task = asyncio.create_task(self._act_later(rule.act_late_s, scope, body))
                self._late.add(task)
                task.add_done_callback(self._late.discard)
                return
            if fault == "drop" and await drop_connection(send):
                return
            if fault == "drop":
                await _send_json(send, 503, error_body("connection dropped (injected fault)", "server_error"), {"connection": "close"})
                return
        await self.app(scope, receive, send)

    def _limited(self, receive):
        """``receive`` that stops a body growing past the limit (one sent without a length)."""
        seen = 0

        async def limited() -> dict:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self._max_body:
                    raise BodyTooLarge(self.config.max_upload_mb)
            return message

        return limited

    async def _act_later(self, delay_s: float, scope: dict[str, Any], body: list[dict]) -> None:
        await asyncio.sleep(delay_s)
        await self.app(scope, replay(body), discard)

    def _authorized(self, scope: dict[str, Any]) -> bool:
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self._key)
        return False


def create_app(config: ServerConfig, on_shutdown: Callable[[], None] | None = None) -> Gateway:
    """The server's ASGI application for ``config`` (opens the data directory).

    ``on_shutdown`` runs at the end of the lifespan (uvicorn re-raises SIGTERM once it
    has shut down, so code after ``Server.run`` may never run).
    """
    config.data_dir.mkdir(parents=True, exist_ok=True)
    store = Store(config.data_dir / DB_NAME)
    files = FileService(store, config.data_dir)
    engine = make_engine(config)
    registry = ModelRegistry(store, config.data_dir, engine)
    jobs = JobManager(config, store, files, registry)
    faults = FaultInjector(config.faults)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.start()
        jobs.start()
        try:
            yield
        finally:
            await anyio.to_thread.run_sync(jobs.stop)
            await anyio.to_thread.run_sync(engine.stop)
            store.close()
            if on_shutdown is not None:
                on_shutdown()

    app = FastAPI(title="nipflow local OpenAI-compatible server", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.config = config
    app.state.store = store
    app.state.files = files
    app.state.registry = registry
    app.state.engine = engine
    app.state.jobs = jobs
    app.state.faults = faults
    install_error_handlers(app)

    @app.exception_handler(BodyTooLarge)
    async def _too_large(request: Request, exc: BodyTooLarge) -> JSONResponse:
        return JSONResponse(too_large(exc.limit_mb), status_code=413, headers={"connection": "close"})

    for router in (routes_models.router, chat.router, routes_files.router, routes_jobs.router, admin):
        app.include_router(router)
    return Gateway(app, config, faults)


__all__ = ["create_app", "Gateway"]

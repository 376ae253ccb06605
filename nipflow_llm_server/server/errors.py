"""OpenAI-shaped API errors: ``{"error": {"message", "type", "param", "code"}}``.

Route code raises :class:`ApiError` (or one of the helpers below); the exception
handlers installed by :func:`install_error_handlers` turn it, FastAPI's validation
errors, unknown routes and unexpected exceptions into OpenAI's JSON shape and status.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)


class ApiError(Exception):
    """An error answered to the client with OpenAI's shape and HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def invalid_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    """400 ``invalid_request_error``."""
    return ApiError(400, message, param=param, code=code)


def not_found(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    """404 ``invalid_request_error``."""
    return ApiError(404, message, param=param, code=code)


def model_not_found(model: str) -> ApiError:
    """OpenAI's answer to an unknown model in a request."""
    return ApiError(
        404,
        f"The model `{model}` does not exist or you do not have access to it.",
        param="model",
        code="model_not_found",
    )


def _param_of(loc: tuple) -> str | None:
    parts = [str(p) for p in loc if p not in ("body", "query", "path")]
    return ".".join(parts) or None


def install_error_handlers(app: FastAPI) -> None:
    """Answer every error with OpenAI's JSON shape."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {}
        param = _param_of(tuple(first.get("loc", ())))
        message = first.get("msg", "Invalid request")
        if param:
            message = f"Invalid value for '{param}': {message}"
        return JSONResponse(error_body(message, "invalid_request_error", param, None), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            message = f"Invalid URL ({request.method} {request.url.path})"
        elif exc.status_code == 405:
            message = f"Method not allowed ({request.method} {request.url.path})"
        else:
            message = str(exc.detail)
        return JSONResponse(error_body(message, "invalid_request_error"), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error in %s %s", request.method, request.url.path)
        return JSONResponse(
            error_body("The server had an error while processing your request.", "server_error"),
            status_code=500,
        )

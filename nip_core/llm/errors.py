"""Exceptions of the client side of nip_core.llm (client factory, server launcher)."""

from __future__ import annotations

from nip_core.errors import NipflowError


class MissingApiKeyError(NipflowError):
    """No API key for a non-local OpenAI endpoint."""

    def __init__(self, base_url: str | None):
        target = base_url or "the OpenAI API"
        super().__init__(
            f"no API key for {target}: set OPENAI_API_KEY (or pass api_key); only a local server "
            "(localhost / 127.0.0.1) may be used without one"
        )


class LocalServerError(NipflowError):
    """The local API server could not be started or reached."""

    def __init__(self, data_dir: str, reason: str, log_tail: str = ""):
        self.data_dir = data_dir
        message = f"local API server for data dir {data_dir}: {reason}"
        if log_tail:
            message += f"\n--- server log (last lines) ---\n{log_tail}"
        super().__init__(message)

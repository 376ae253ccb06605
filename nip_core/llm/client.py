"""Factory of the official ``openai`` client, for the real API or the local server."""

from __future__ import annotations

import os
from urllib.parse import urlparse

import openai

from nip_core.llm.errors import MissingApiKeyError

#: The key sent to a local server that does not require one (the client insists on a key).
LOCAL_PLACEHOLDER_KEY = "sk-local-nipflow"
_LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", "[::1]"}


def is_local_url(base_url: str | None) -> bool:
    """Whether ``base_url`` points at this machine (loopback)."""
    if not base_url:
        return False
    host = (urlparse(base_url).hostname or "").lower()
    return host in _LOCAL_HOSTS or host.startswith("127.")


def make_openai_client(
    base_url: str | None = None,
    api_key: str | None = None,
    *,
    max_retries: int = 5,
    timeout: float = 600.0,
) -> openai.OpenAI:
    """An ``openai.OpenAI`` client with retries.

    Parameters
    ----------
    base_url
        API root such as ``http://127.0.0.1:8765/v1``; default ``$OPENAI_BASE_URL``, else
        OpenAI's.
    api_key
        Default ``$OPENAI_API_KEY``. A local (loopback) server without a key gets a
        placeholder, because the client refuses to start without one.
    max_retries
        Retries of the client on 408/409/429/5xx and connection errors (with backoff,
        honouring ``Retry-After``).
    timeout
        Seconds per request (OpenAI's SDK default: a long completion, or a local model on a
        CPU answering a whole batch, takes minutes; a timed-out request is retried).

    Raises
    ------
    MissingApiKeyError
        No key for a non-local endpoint.
    """
    base_url = base_url or os.environ.get("OPENAI_BASE_URL") or None
    api_key = api_key or os.environ.get("OPENAI_API_KEY") or None
    if api_key is None:
        if not is_local_url(base_url):
            raise MissingApiKeyError(base_url)
        api_key = LOCAL_PLACEHOLDER_KEY
    return openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=max_retries, timeout=timeout)

"""Fault injection for reliability tests: rate limits, server errors, slow and dropped requests.

A :class:`FaultConfig` gives, per endpoint group, the probability of each fault. Groups
are ``models``, ``chat.completions``, ``files`` and ``fine_tuning.jobs`` (by path under
``/v1``); ``*`` applies to every group without its own rule. Each request to ``/v1``
draws once from its group's random stream (seeded by ``seed`` and the group name, so a
sequence of requests meets the same faults on every run):

* ``rate_429``: answer 429 ``rate_limit_exceeded``;
* ``rate_500``: answer 500 ``server_error``;
* ``rate_503``: answer 503 (overloaded);

  these three carry ``Retry-After`` (seconds, ``retry_after_s``) and ``retry-after-ms``
  headers, which the openai client honours, so tests with many faults stay fast;
* ``rate_drop``: close the connection without any response (the request is not handled);
* ``rate_lose_response``: handle the request in full (a file is stored, a job created)
  and then close the connection without sending the response, as a proxy or a flaky
  network that loses a response does: the client cannot tell whether it happened;
* ``rate_act_late``: close the connection at once without a response, and handle the
  request in full ``act_late_s`` seconds later, as a server does that is still working on a
  request whose client timed out (or whose proxy answered 502): the object appears in
  listings only after the client gave up on it;
* ``rate_slow`` (an independent second draw): wait ``slow_ms`` before handling.

``methods`` (e.g. ``["POST"]``) limits a rule to requests of those HTTP methods; the
others of the group pass untouched and draw nothing. All faults but ``rate_lose_response``
and ``rate_act_late`` are injected *before* the request is handled, so retrying them never has a side effect
twice; a lost response is exactly the case where a blind retry duplicates the object. Set them at start-up (``--faults JSON``) or at run time with
``POST /admin/faults`` (``GET`` shows them with the counts injected so far and the requests
that drew, per group; ``DELETE`` clears them).
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

ENDPOINT_GROUPS = ("models", "chat.completions", "files", "fine_tuning.jobs")


class FaultRule(BaseModel):
    """Fault probabilities of one endpoint group."""

    model_config = ConfigDict(extra="forbid")

    rate_429: float = Field(0.0, ge=0, le=1)
    rate_500: float = Field(0.0, ge=0, le=1)
    rate_503: float = Field(0.0, ge=0, le=1)
    rate_drop: float = Field(0.0, ge=0, le=1)
    rate_lose_response: float = Field(0.0, ge=0, le=1)
    rate_act_late: float = Field(0.0, ge=0, le=1)
    act_late_s: float = Field(2.0, ge=0, le=600)
    methods: list[str] | None = Field(None, description="only requests with these HTTP methods (all if None)")
    rate_slow: float = Field(0.0, ge=0, le=1)
    slow_ms: float = Field(500.0, ge=0)
    retry_after_s: float = Field(0.05, ge=0, le=120)

    @model_validator(mode="after")
    def _total(self) -> "FaultRule":
        if (self.rate_429 + self.rate_500 + self.rate_503 + self.rate_drop + self.rate_lose_response
                + self.rate_act_late > 1.0 + 1e-9):
            raise ValueError("rate_429 + rate_500 + rate_503 + rate_drop + rate_lose_response + rate_act_late "
                             "must be at most 1")
        if self.methods is not None:
            self.methods = [m.upper() for m in self.methods]
        return self


class FaultConfig(BaseModel):
    """Fault rules per endpoint group (``*`` for the others) and the seed of the draws."""

    model_config = ConfigDict(extra="forbid")

    seed: int = 0
    endpoints: dict[str, FaultRule] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _groups(self) -> "FaultConfig":
        unknown = set(self.endpoints) - set(ENDPOINT_GROUPS) - {"*"}
        if unknown:
            raise ValueError(f"unknown endpoint group(s) {sorted(unknown)}; use {list(ENDPOINT_GROUPS)} or '*'")
        return self

    @classmethod
    def parse(cls, value: "FaultConfig | dict | str | Path | None") -> "FaultConfig":
        """From a config, a dict, a JSON string, ``@path`` to a JSON file, or ``None``."""
        if value is None:
            return cls()
        if isinstance(value, FaultConfig):
            return value
        if isinstance(value, Path):
            value = value.read_text()
        if isinstance(value, str):
            if value.startswith("@"):
                value = Path(value[1:]).read_text()
            value = json.loads(value)
        return cls.model_validate(value)


def endpoint_group(path: str) -> str | None:
    """The fault group of a request path, ``None`` outside ``/v1``."""
    if not path.startswith("/v1/"):
        return None
    rest = path[4:]
    if rest.startswith("chat/completions"):
        return "chat.completions"
    if rest.startswith("fine_tuning/"):
        return "fine_tuning.jobs"
    if rest.startswith("files"):
        return "files"
    if rest.startswith("models"):
        return "models"
    return None


class FaultInjector:
    """Draws the faults of requests (used from the event loop only)."""

    def __init__(self, config: FaultConfig | None = None):
        self.configure(config or FaultConfig())

    def configure(self, config: FaultConfig) -> None:
        self.config = config
        self._rngs = {g: random.Random(f"{config.seed}|{g}") for g in (*ENDPOINT_GROUPS, "*")}
        self.counts: Counter[str] = Counter()
        self.requests: Counter[str] = Counter()  # requests that drew, per group

    def _rule(self, group: str) -> FaultRule | None:
        return self.config.endpoints.get(group) or self.config.endpoints.get("*")

    def draw(self, group: str, method: str = "GET") -> tuple[str | None, float, FaultRule | None]:
        """(fault or None, seconds to delay first, rule) for one ``method`` request of ``group``."""
        rule = self._rule(group)
        if rule is None or (rule.methods is not None and method.upper() not in rule.methods):
            return None, 0.0, None
        rng = self._rngs[group]
        self.requests[group] += 1
        u, v = rng.random(), rng.random()
        delay = rule.slow_ms / 1000.0 if v < rule.rate_slow else 0.0
        if delay:
            self.counts[f"{group}:slow"] += 1
        fault = None
        edges = (("429", rule.rate_429), ("500", rule.rate_500), ("503", rule.rate_503), ("drop", rule.rate_drop),
                 ("lose_response", rule.rate_lose_response), ("act_late", rule.rate_act_late))
        acc = 0.0
        for name, rate in edges:
            acc += rate
            if u < acc:
                fault = name
                self.counts[f"{group}:{name}"] += 1
                break
        return fault, delay, rule

    def status(self) -> dict:
        return {"config": self.config.model_dump(), "injected": dict(self.counts), "requests": dict(self.requests)}


async def discard(message: dict) -> None:
    """An ASGI ``send`` that loses every message (the response of a lost-response fault)."""


async def read_request(receive) -> list[dict]:
    """Every ``http.request`` message of a request (its whole body), to be replayed later."""
    messages = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        messages.append(message)
        if not message.get("more_body", False):
            break
    return messages


def replay(messages: list[dict]):
    """An ASGI ``receive`` that hands out ``messages`` again, then a disconnect."""
    pending = list(messages)

    async def receive() -> dict:
        return pending.pop(0) if pending else {"type": "http.disconnect"}

    return receive


async def drop_connection(send) -> bool:
    """Abort the client's connection without a response (uvicorn's h11/httptools cycle).

    Returns False when the transport cannot be reached, in which case the caller answers
    with an error instead.
    """
    transport = getattr(getattr(send, "__self__", None), "transport", None)
    if transport is None:
        return False
    transport.abort()
    # let uvicorn see the disconnect so it does not try to answer a 500 itself
    for _ in range(3):
        await asyncio.sleep(0)
    return True

"""Start-up configuration of the local OpenAI-compatible server."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from nip_core.llm.server.faults import FaultConfig

API_KEY_ENV = "NIPFLOW_API_SERVER_KEY"
ORGANIZATION = "org-local"

# Durations of the job phases at job_time_scale 1.0, in seconds.
VALIDATING_S = 3.0
QUEUED_S = 2.0
RUNNING_MIN_S = 20.0


class ServerConfig(BaseModel):
    """Options of one server process.

    ``job_time_scale`` multiplies the pacing of fine-tuning jobs (about 25 s at 1.0:
    3 s validating files, 2 s queued, at least 20 s running; training itself takes what
    it takes). ``latency_ms`` is added to every chat completion, without blocking other
    requests. ``api_key``: when set, every ``/v1`` and ``/admin`` request must carry it as
    a Bearer token.
    """

    model_config = ConfigDict(extra="forbid")

    data_dir: Path
    host: str = "127.0.0.1"
    port: int = Field(0, ge=0, le=65535)
    job_time_scale: float = Field(1.0, ge=0)
    api_key: SecretStr | None = Field(None, repr=False)
    latency_ms: float = Field(0.0, ge=0)
    faults: FaultConfig = Field(default_factory=FaultConfig)
    job_workers: int = Field(2, ge=1)
    max_job_attempts: int = Field(3, ge=1)
    organization: str = ORGANIZATION
    log_level: str = "warning"

"""Start-up configuration of the local OpenAI-compatible server."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from nipflow_llm_server.server.faults import FaultConfig

API_KEY_ENV = "NIPFLOW_API_SERVER_KEY"
ORGANIZATION = "org-local"

# Durations of the job phases at job_time_scale 1.0, in seconds.
VALIDATING_S = 3.0
QUEUED_S = 2.0
RUNNING_MIN_S = 20.0

ENGINES = ("selection", "transformers", "vllm")
#: Engine options (field -> command-line flag) and the engines that use them; giving one to
#: another engine is refused, naming the flag.
ENGINE_OPTIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "base_models": ("--base-model", ("transformers", "vllm")),
    "device": ("--device", ("transformers", "vllm")),
    "full_fine_tune": ("--full-fine-tune", ("transformers",)),
    "allow_download": ("--allow-download", ("transformers", "vllm")),
    "batch_window_ms": ("--batch-window-ms", ("transformers", "vllm")),
    "max_batch_size": ("--max-batch-size", ("transformers", "vllm")),
    "prefix_cache_mb": ("--prefix-cache-mb", ("transformers",)),
    "tensor_parallel_size": ("--tensor-parallel-size", ("vllm",)),
    "gpu_memory_utilization": ("--gpu-memory-utilization", ("vllm",)),
}


class ServerConfig(BaseModel):
    """Options of one server process.

    ``job_time_scale`` multiplies the pacing of fine-tuning jobs (about 25 s at 1.0:
    3 s validating files, 2 s queued, at least 20 s running; training itself takes what
    it takes). ``latency_ms`` is added to every chat completion, without blocking other
    requests. ``api_key``: when set, every ``/v1`` and ``/admin`` request must carry it as
    a Bearer token. ``max_upload_mb``: the largest request body accepted (an uploaded file
    above it is answered 413 before it is stored; OpenAI's limit for a file is 512 MB).

    ``engine`` picks the model family (:mod:`nipflow_llm_server.engines`): ``selection`` (the
    default), ``transformers`` or ``vllm``. The engine options (:data:`ENGINE_OPTIONS`) are
    refused, naming their flag, when given to an engine that does not use them:
    ``base_models`` (``NAME=PATH_OR_HF_ID`` or ``PATH_OR_HF_ID``; ``nipflow-tiny-lm`` is always
    served), ``device`` (``auto``, ``cpu``, ``cuda``, ``cuda:N``), ``full_fine_tune`` (train all
    weights instead of a LoRA adapter), ``allow_download`` (else the Hugging Face hub is never
    contacted), ``batch_window_ms`` / ``max_batch_size`` (requests arriving within the window
    are generated together, up to that many sequences), ``prefix_cache_mb`` (memory for the
    keys and values of recent conversations, reused by their next turns; 0 turns it off),
    ``tensor_parallel_size`` and
    ``gpu_memory_utilization`` (vLLM).
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
    max_upload_mb: float = Field(512.0, gt=0)
    max_job_attempts: int = Field(3, ge=1)
    organization: str = ORGANIZATION
    log_level: str = "warning"
    engine: Literal["selection", "transformers", "vllm"] = "selection"
    base_models: list[str] = Field(default_factory=list)
    device: str = "auto"
    full_fine_tune: bool = False
    allow_download: bool = False
    batch_window_ms: float = Field(5.0, ge=0, le=1000)
    max_batch_size: int = Field(32, ge=1, le=1024)
    prefix_cache_mb: float = Field(2048.0, ge=0)
    tensor_parallel_size: int = Field(1, ge=1)
    gpu_memory_utilization: float = Field(0.5, gt=0, le=1)

    @model_validator(mode="after")
    def _engine_options(self) -> "ServerConfig":
        for field in sorted(self.model_fields_set & set(ENGINE_OPTIONS)):
            flag, engines = ENGINE_OPTIONS[field]
            if self.engine not in engines:
                raise ValueError(f"{flag} is not used by --engine {self.engine} (only by --engine {' / '.join(engines)})")
        if self.device != "auto" and not (self.device in ("cpu", "cuda") or self.device.startswith("cuda:")):
            raise ValueError(f"--device must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        return self

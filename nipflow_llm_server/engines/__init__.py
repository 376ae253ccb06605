"""Model engines of the local OpenAI-compatible server (``nipflow api-server --engine``).

``selection`` (default) needs nothing beyond the base install; ``transformers`` and
``vllm`` need the ``local-llm`` extra (``pip install -e ".[local-llm]"``), and ``vllm``
also the ``vllm`` package and a CUDA GPU. :func:`check_engine` refuses an engine that
cannot run here with an :class:`EngineError` naming the flag; :func:`make_engine` builds
the engine a :class:`~nipflow_llm_server.server.config.ServerConfig` asks for. Heavy imports
(torch, transformers, TRL, vLLM) happen only for the engine chosen.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from nipflow_llm_server.engines.base import Engine, EngineError

__all__ = ["Engine", "EngineError", "check_engine", "make_engine"]

LOCAL_LLM_PACKAGES = ("torch", "transformers", "trl", "peft", "accelerate", "datasets")


def _missing(packages: tuple[str, ...]) -> list[str]:
    return [name for name in packages if importlib.util.find_spec(name) is None]


def check_engine(config: Any) -> None:
    """Refuse an engine that cannot run in this environment (before any state is touched).

    Raises
    ------
    EngineError
        ``--engine transformers`` / ``--engine vllm`` without the ``local-llm`` packages;
        ``--engine vllm`` without the ``vllm`` package or without a CUDA GPU; a ``--device``
        that is not there; a ``--base-model`` that cannot be found offline.
    """
    if config.engine == "selection":
        return
    missing = _missing(LOCAL_LLM_PACKAGES)
    if missing:
        raise EngineError(
            f"--engine {config.engine} needs the packages {', '.join(missing)}: install the 'local-llm' extra "
            "(pip install -e \".[local-llm]\")"
        )
    if config.engine == "vllm":
        from nipflow_llm_server.engines.vllm_engine import check_vllm

        check_vllm()
    make_engine(config)  # parses and finds the base models, resolves the device


def make_engine(config: Any) -> Engine:
    """The engine named by ``config.engine`` with its options."""
    if config.engine == "selection":
        from nipflow_llm_server.engines.selection import SelectionEngine

        return SelectionEngine()
    options = dict(base_models=list(config.base_models), device=config.device, allow_download=config.allow_download,
                   batch_window_ms=config.batch_window_ms, max_batch_size=config.max_batch_size)
    if config.engine == "transformers":
        from nipflow_llm_server.engines.transformers_engine import TransformersEngine

        return TransformersEngine(full_fine_tune=config.full_fine_tune, prefix_cache_mb=config.prefix_cache_mb, **options)
    if config.engine == "vllm":
        from nipflow_llm_server.engines.vllm_engine import VllmEngine

        return VllmEngine(tensor_parallel_size=config.tensor_parallel_size,
                          gpu_memory_utilization=config.gpu_memory_utilization, **options)
    raise EngineError(f"--engine {config.engine!r} is not one of selection, transformers, vllm")

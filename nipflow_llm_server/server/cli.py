"""Command line of the local OpenAI-compatible server (``nipflow api-server``).

``python -m nipflow_llm_server.server --host 127.0.0.1 --port P --data-dir D
[--job-time-scale X] [--api-key K] [--latency-ms MS] [--faults JSON|@file]
[--engine selection|transformers|vllm] [engine options]``

The process takes an exclusive lock on the data directory (one server per directory),
binds the socket itself (``--port 0`` picks a free port), records
``{pid, host, port, base_url}`` in ``D/server.json`` and serves until SIGINT/SIGTERM.
The API key may also come from ``$NIPFLOW_API_SERVER_KEY``; it is never printed.
``nipflow api-server stop [--data-dir D | --port P]`` stops a running server
(:mod:`nipflow_llm_server.server.control`).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import logging
import os
import socket
import sys
import time
from pathlib import Path

from pydantic import ValidationError

from nipflow_llm_server.server.config import API_KEY_ENV, ENGINE_OPTIONS, ENGINES, ServerConfig
from nipflow_llm_server.server.faults import FaultConfig
from nipflow_llm_server.server.server_files import (  # noqa: F401 (re-exported: the cli's public names)
    DEFAULT_PORT,
    EXIT_LOCKED,
    EXIT_USAGE,
    LOCK_FILE,
    SERVER_FILE,
    default_data_dir,
    read_server_file,
)
from nip_core.utils.cli_args import ArgumentParser, directory_problem, host, port_or_zero
from nip_core.utils.hosts import is_loopback_host
from nip_core.utils.fileio import atomic_write_bytes as atomic_write

def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="nipflow api-server",
        description="Local OpenAI-compatible server (chat completions, files, fine-tuning) for offline runs and tests.",
        epilog="`nipflow api-server stop [--data-dir D | --port P]` stops a running server.",
    )
    parser.add_argument("--host", type=host, default="127.0.0.1",
                        help="address to bind (default 127.0.0.1, loopback only)")
    parser.add_argument("--port", type=port_or_zero, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0 picks a free one)")
    parser.add_argument("--data-dir", type=Path, default=None, help="where files, jobs and models are kept (default $NIPFLOW_DATA_DIR/api_server, "
                        "else ~/.cache/nipflow/data/api_server)")
    parser.add_argument("--job-time-scale", type=float, default=1.0, help="multiplies the pacing of fine-tuning jobs (1.0: about 25 s)")
    parser.add_argument("--api-key", default=None, help=f"require this Bearer key (default ${API_KEY_ENV}; none: no auth)")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="latency added to every chat completion")
    parser.add_argument("--faults", default=None, help="fault injection config, JSON or @file (see nipflow_llm_server.server.faults)")
    parser.add_argument("--job-workers", type=int, default=2, help="fine-tuning worker threads")
    parser.add_argument("--max-upload-mb", type=float, default=512.0,
                        help="largest request body accepted, e.g. an uploaded file (default 512, OpenAI's limit)")
    parser.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"])
    engine = parser.add_argument_group("engine", "the model family served (docs/text_backends.md)")
    engine.add_argument("--engine", default="selection", choices=ENGINES,
                        help="selection: the built-in response-selection policy (default); transformers: Hugging Face "
                             "causal LMs trained with TRL; vllm: the same training, generation by vLLM (GPU)")
    # engine options default to None so that only the ones given are checked against --engine
    engine.add_argument("--base-model", dest="base_models", action="append", default=None, metavar="[NAME=]PATH_OR_ID",
                        help="a base model to serve: smollm2-135m-instruct (built in: SmolLM2-135M-Instruct, "
                             "installed by `make venv`), a local directory or a Hugging Face id (repeatable; "
                             "nipflow-tiny-lm is always served)")
    engine.add_argument("--device", default=None, help="auto (default), cpu, cuda or cuda:N")
    engine.add_argument("--full-fine-tune", action="store_true", default=None,
                        help="train all weights instead of a LoRA adapter")
    engine.add_argument("--allow-download", action="store_true", default=None,
                        help="let base models be downloaded from the Hugging Face hub (default: offline only)")
    engine.add_argument("--batch-window-ms", type=float, default=None,
                        help="requests arriving within this window are generated together (default 5)")
    engine.add_argument("--max-batch-size", type=int, default=None, help="sequences generated together at most (default 32)")
    engine.add_argument("--prefix-cache-mb", type=float, default=None,
                        help="transformers: memory for the keys and values of recent conversations, which their "
                             "next turns reuse instead of computing them again (default 2048; 0: off)")
    engine.add_argument("--tensor-parallel-size", type=int, default=None, help="vLLM: GPUs one model is split over (default 1)")
    engine.add_argument("--gpu-memory-utilization", type=float, default=None,
                        help="vLLM: share of the GPU memory vLLM may take (default 0.5, leaving room for training)")
    return parser


def _flag(field: str) -> str:
    """The command-line flag of a :class:`ServerConfig` field."""
    return ENGINE_OPTIONS[field][0] if field in ENGINE_OPTIONS else "--" + field.replace("_", "-")


def config_error_line(error: ValidationError) -> str:
    """A :class:`ServerConfig` validation error as one line naming the flags."""
    problems = []
    for item in error.errors():
        message = str(item.get("msg", "invalid")).removeprefix("Value error, ")
        field = str(item["loc"][0]) if item.get("loc") else None
        problems.append(f"{_flag(field)} {item.get('input')!r}: {message}" if field else message)
    return "; ".join(problems)


def _engine_options(args: argparse.Namespace) -> dict:
    return {name: getattr(args, name) for name in ENGINE_OPTIONS if getattr(args, name) is not None}


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto must be IPPROTO_TCP: asyncio only sets TCP_NODELAY on accepted sockets whose
    # proto says TCP, and without it keep-alive requests wait 40 ms for a delayed ACK
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def _lock(data_dir: Path):
    handle = open(data_dir / LOCK_FILE, "a+")
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


def main(argv: list[str] | None = None) -> int:
    """Run the server until interrupted (``stop``: stop a running one); returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["stop"]:
        from nipflow_llm_server.server.control import stop_main

        return stop_main(list(argv[1:]))
    args = build_parser().parse_args(argv)
    data_dir = (args.data_dir or default_data_dir()).absolute()
    problem = directory_problem(data_dir, write=True)
    if problem:
        print(f"nipflow api-server: error: --data-dir {data_dir}: {problem}", file=sys.stderr)
        return EXIT_USAGE
    try:
        faults = FaultConfig.parse(args.faults)
    except (ValidationError, ValueError, OSError) as exc:
        detail = ("; ".join(f"{'.'.join(map(str, e['loc'])) or 'faults'}: {e['msg']}" for e in exc.errors())
                  if isinstance(exc, ValidationError) else exc)
        print(f"nipflow api-server: error: --faults: {' '.join(str(detail).split())}", file=sys.stderr)
        return EXIT_USAGE
    try:
        config = ServerConfig(
            data_dir=data_dir,
            host=args.host,
            port=args.port,
            job_time_scale=args.job_time_scale,
            api_key=args.api_key or os.environ.get(API_KEY_ENV) or None,
            latency_ms=args.latency_ms,
            faults=faults,
            job_workers=args.job_workers,
            max_upload_mb=args.max_upload_mb,
            log_level=args.log_level,
            engine=args.engine,
            **_engine_options(args),
        )
    except ValidationError as exc:
        print(f"nipflow api-server: error: {config_error_line(exc)}", file=sys.stderr)
        return EXIT_USAGE
    if config.api_key is None and not is_loopback_host(args.host):
        print(f"nipflow api-server: error: --host {args.host}: without a key the server would take uploads, "
              f"fine-tuning jobs and fault settings (/admin/faults) from anyone who reaches it; set --api-key "
              f"or ${API_KEY_ENV}, or keep the default --host 127.0.0.1", file=sys.stderr)
        return EXIT_USAGE
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from nipflow_llm_server.engines import EngineError, check_engine

    try:
        check_engine(config)  # before taking the data directory: a refused engine leaves no trace
    except EngineError as exc:
        print(f"nipflow api-server: {exc}", file=sys.stderr)
        return EXIT_USAGE
    data_dir.mkdir(parents=True, exist_ok=True)
    lock = _lock(data_dir)
    if lock is None:
        other = read_server_file(data_dir) or {}
        print(
            f"nipflow api-server: another server (pid {other.get('pid', '?')}, {other.get('base_url', '?')}) "
            f"is serving {data_dir}",
            file=sys.stderr,
        )
        return EXIT_LOCKED
    try:
        return _serve(config, lock)
    finally:
        lock.close()


def _serve(config: ServerConfig, lock) -> int:
    import uvicorn

    from nipflow_llm_server.server.app import create_app

    try:
        sock = _bind(config.host, config.port)
    except OSError as exc:
        print(f"nipflow api-server: cannot bind {config.host}:{config.port}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    port = sock.getsockname()[1]
    host = f"[{config.host}]" if ":" in config.host else config.host
    info = {
        "pid": os.getpid(),
        "host": config.host,
        "port": port,
        "base_url": f"http://{host}:{port}/v1",
        "data_dir": str(config.data_dir),
        "started_at": time.time(),
    }
    def forget_server_file() -> None:
        current = read_server_file(config.data_dir)
        if current and current.get("pid") == os.getpid():
            (config.data_dir / SERVER_FILE).unlink(missing_ok=True)

    app = create_app(config, on_shutdown=forget_server_file)
    atomic_write(config.data_dir / SERVER_FILE, json.dumps(info).encode("utf-8"))
    print(f"nipflow api-server: serving {info['base_url']} (data dir {config.data_dir})", file=sys.stderr, flush=True)
    server = uvicorn.Server(
        uvicorn.Config(app, log_level=config.log_level, access_log=False, lifespan="on", timeout_keep_alive=30)
    )
    try:
        server.run(sockets=[sock])
    finally:
        forget_server_file()
    return 0

"""Stopping a running local server: ``nipflow api-server stop [--data-dir D | --port P]``.

A server records ``{pid, host, port, base_url, data_dir}`` in ``D/server.json`` while it
serves (:mod:`nipflow_llm_server.server.cli`). Stopping is graceful: SIGTERM (running
fine-tuning jobs are persisted and resumed at the next start), a wait, then SIGKILL.
With ``--port`` the server is found through its ``/health`` answer, which names its pid
and data directory; the pid is only signalled if ``server.json`` there records the same
pid, so a stale file or another program on the port is never killed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from nip_core.utils.cli_args import ArgumentParser, directory_problem, host, port
from nip_core.utils.fileio import pid_alive

EXIT_OK = 0
EXIT_USAGE = 2


@dataclass
class StopResult:
    """What :func:`stop_server` did: ``how`` is ``"sigterm"``, ``"sigkill"`` or ``"gone"``."""

    pid: int
    base_url: str
    data_dir: str
    how: str


def terminate_pid(pid: int, timeout: float = 20.0) -> str:
    """SIGTERM ``pid``, wait up to ``timeout`` seconds, then SIGKILL it.

    Returns ``"sigterm"`` if it exited after SIGTERM, ``"sigkill"`` if it had to be
    killed and ``"gone"`` if it did not exist.
    """
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return "gone"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return "sigterm"
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return "sigterm"
    deadline = time.monotonic() + 10.0
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return "sigkill"


def _read_record(data_dir: Path) -> dict | None:
    from nipflow_llm_server.server.server_files import read_server_file

    return read_server_file(data_dir)


def _health(host: str, port: int, timeout: float = 2.0) -> dict | None:
    name = f"[{host}]" if ":" in host else host
    try:
        with urllib.request.urlopen(f"http://{name}:{port}/health", timeout=timeout) as response:
            body = json.loads(response.read())
    except (OSError, ValueError):
        return None
    return body if isinstance(body, dict) and body.get("status") == "ok" else None


def find_data_dir_by_port(host: str, port: int) -> Path | None:
    """The data directory of the local server answering on ``host:port``, if any."""
    body = _health(host, port)
    if body is None or not body.get("data_dir"):
        return None
    return Path(body["data_dir"])


def stop_server(data_dir: Path, timeout: float = 20.0) -> StopResult | None:
    """Stop the server recorded in ``data_dir/server.json``; ``None`` if none runs there."""
    data_dir = Path(data_dir).absolute()
    record = _read_record(data_dir)
    if not record:
        return None
    pid = int(record.get("pid", -1))
    if not pid_alive(pid):
        return None
    how = terminate_pid(pid, timeout)
    return StopResult(pid=pid, base_url=str(record.get("base_url", "?")), data_dir=str(data_dir), how=how)


def build_stop_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="nipflow api-server stop",
        description="Stop a running local OpenAI-compatible server (SIGTERM, then SIGKILL after --timeout).",
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--data-dir", type=Path, default=None,
                       help="the server's data directory (default: that of `nipflow api-server`)")
    where.add_argument("--port", type=port, default=None, help="the port the server listens on")
    parser.add_argument("--host", type=host, default="127.0.0.1",
                        help="with --port: the address to ask (default 127.0.0.1)")
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds between SIGTERM and SIGKILL (default 20)")
    return parser


def stop_main(argv: list[str]) -> int:
    """``nipflow api-server stop``; returns the exit status (0 also when nothing runs)."""
    parser = build_stop_parser()
    args = parser.parse_args(argv)
    if args.host != "127.0.0.1" and args.port is None:
        print("nipflow api-server stop: --host is only used with --port", file=sys.stderr)
        return EXIT_USAGE
    if args.timeout <= 0:
        print(f"nipflow api-server stop: --timeout must be positive, got {args.timeout}", file=sys.stderr)
        return EXIT_USAGE
    if args.data_dir is not None:
        problem = directory_problem(args.data_dir, write=False)
        if problem:
            print(f"nipflow api-server stop: error: --data-dir {args.data_dir}: {problem}", file=sys.stderr)
            return EXIT_USAGE
    if args.port is not None:
        data_dir = find_data_dir_by_port(args.host, args.port)
        if data_dir is None:
            print(f"nipflow api-server stop: no local API server answers on {args.host}:{args.port}; nothing stopped")
            return EXIT_OK
        record = _read_record(data_dir) or {}
        if int(record.get("port", -1)) != args.port:
            print(f"nipflow api-server stop: the server on {args.host}:{args.port} names data dir {data_dir}, "
                  f"whose server.json records another server; nothing stopped", file=sys.stderr)
            return EXIT_USAGE
    else:
        from nipflow_llm_server.server.server_files import default_data_dir

        data_dir = (args.data_dir or default_data_dir()).absolute()
    result = stop_server(data_dir, timeout=args.timeout)
    if result is None:
        print(f"nipflow api-server stop: no server runs on data dir {data_dir}; nothing stopped")
        return EXIT_OK
    how = {"sigterm": "stopped", "sigkill": "killed (did not stop after SIGTERM)", "gone": "already gone"}[result.how]
    print(f"nipflow api-server stop: {how}: pid {result.pid}, {result.base_url} (data dir {result.data_dir})")
    return EXIT_OK

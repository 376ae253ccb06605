"""Read back an offline W&B run file (``run-<id>.wandb``) without a W&B server.

The file is a LevelDB-style log: a 7-byte header (``:W&B``, a 2-byte magic, a version
byte), then 32 KiB blocks of records ``crc32 (4) | length (2, LE) | type (1) | data``,
where type 1 is a whole record and 2/3/4 the first/middle/last piece of a record split
across blocks. Each whole record is a protobuf ``wandb_internal_pb2.Record``. Used by the
tests (and ``nipflow status``) to check what a run logged.
"""

from __future__ import annotations

import glob
import json
import os
import struct
import time
from typing import Any, Iterator

BLOCK = 32 * 1024
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def iter_raw_records(path: str) -> Iterator[bytes]:
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b":W&B":
        raise ValueError(f"{path}: not a W&B run file")
    pos = HEADER
    pending = b""
    while pos + 7 <= len(data):
        block_left = BLOCK - (pos % BLOCK)
        if block_left < 7:  # trailer padding
            pos += block_left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and length == 0:  # zero padding at the end of a block
            pos += block_left
            continue
        if pos + 7 + length > len(data):
            return  # a record still being written (the file of a live run)
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == FULL:
            yield chunk
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            yield pending + chunk
            pending = b""


def is_complete(run_file: str) -> bool:
    """Whether the run file ends with its ``exit`` record (W&B wrote everything of the run)."""
    from wandb.proto import wandb_internal_pb2 as pb

    last = None
    try:
        for raw in iter_raw_records(run_file):
            last = raw
    except (OSError, ValueError):  # not there yet, or not even its header
        return False
    if last is None:
        return False
    record = pb.Record()
    record.ParseFromString(last)
    return record.WhichOneof("record_type") == "exit"


def wait_until_complete(run_file: str, timeout_s: float) -> bool:
    """Wait until ``run_file`` is complete (see :func:`is_complete`); False after ``timeout_s``.

    ``wandb.Run.finish()`` returns once W&B's service has the run's last record, but the
    service writes the run file out afterwards, on its own time (seen: the file still at
    its 7-byte header right after ``finish()`` under load). Whoever reads the file next —
    ``nipflow status``, a restore from the W&B directory — needs it whole.
    """
    deadline = time.monotonic() + timeout_s
    delay = 0.02
    while not is_complete(run_file):
        if time.monotonic() >= deadline:
            return False
        time.sleep(delay)
        delay = min(delay * 2, 0.5)
    return True


def read_offline_run(run_file: str) -> dict[str, Any]:
    """Summarise one offline run file: run id, config, history rows and logged artifacts."""
    from wandb.proto import wandb_internal_pb2 as pb

    out: dict[str, Any] = {"run_id": None, "config": {}, "history": [], "artifacts": []}
    for raw in iter_raw_records(run_file):
        record = pb.Record()
        record.ParseFromString(raw)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            out["run_id"] = record.run.run_id
            for item in record.run.config.update:
                out["config"][item.key] = json.loads(item.value_json)
        elif kind == "config":
            for item in record.config.update:
                out["config"][item.key] = json.loads(item.value_json)
        elif kind == "artifact":
            art = record.artifact
            out["artifacts"].append({"name": art.name, "type": art.type,
                                     "files": sorted(e.path for e in art.manifest.contents)})
        elif kind == "history":
            row = {}
            for item in record.history.item:
                key = item.key or "/".join(item.nested_key)
                row[key] = json.loads(item.value_json)
            out["history"].append(row)
    return out


def read_offline_runs(wandb_dir: str) -> list[dict[str, Any]]:
    """Every offline run file under ``wandb_dir`` (oldest first)."""
    pattern = os.path.join(wandb_dir, "**", "offline-run-*", "run-*.wandb")
    runs = []
    for path in sorted(glob.glob(pattern, recursive=True)):
        run = read_offline_run(path)
        # A process killed before W&B flushed its run record still names the file by run id.
        run["file_run_id"] = os.path.basename(path)[len("run-"):-len(".wandb")]
        if run["run_id"] is None:
            run["run_id"] = run["file_run_id"]
        runs.append(run | {"file": path})
    return runs

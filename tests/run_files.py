"""Reading a run's files from its directory as a reader does (tests that look at the files directly).

After a driver took a run over from one that never released it (a SIGKILL, a lost worker), the
run's mutable files carry an epoch tag (``state.g0000000003.json``): the file to read is the
newest version, which :func:`nip_core.runs.fencing.current_file` names.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nip_core.runs.fencing import current_file


def run_file(run_dir: Path | str, rel: str) -> Path:
    """The file a reader reads for ``rel`` of the local run at ``run_dir``."""
    return Path(current_file(str(run_dir), rel))


def run_text(location: Path | str, rel: str) -> str:
    """The text of ``rel`` of the run at ``location`` (a local path or an ``s3://`` URL), newest version."""
    import fsspec

    with fsspec.open(current_file(str(location), rel), "rt") as f:
        return f.read()


def run_json(run_dir: Path | str, rel: str) -> Any:
    """The JSON content of ``rel`` of the local run at ``run_dir`` (its newest version)."""
    return json.loads(run_file(run_dir, rel).read_text())


def trainer_owned(state: dict) -> dict:
    """A trainer checkpoint's state less Python's and numpy's global RNG states.

    Those two are saved (and restored) for code that draws from them, but no trainer does:
    other threads of the process do — Prefect's service loops and botocore's retries draw
    jitter from ``random`` — so in a test process that earlier tests left such threads in,
    they move between two runs, and the two checkpoints' bytes with them.
    """
    rng = dict(state["rng"])
    assert {"python", "numpy"} <= set(rng)
    del rng["python"], rng["numpy"]
    return {**state, "rng": rng}


def state_digest(value: Any) -> str:
    """A sha256 of a checkpoint state (tensors and arrays by dtype, shape and bytes; order kept)."""
    import hashlib

    import numpy as np
    import torch

    digest = hashlib.sha256()

    def walk(node: Any) -> None:
        if isinstance(node, torch.Tensor):
            t = node.detach().cpu().contiguous()
            flat = t.reshape(-1)
            raw = flat.view(torch.uint8) if t.dtype != torch.bool else flat.to(torch.uint8)
            digest.update(f"tensor{t.dtype}{tuple(t.shape)}".encode() + raw.numpy().tobytes())
        elif isinstance(node, np.ndarray):
            digest.update(f"ndarray{node.dtype}{node.shape}".encode() + np.ascontiguousarray(node).tobytes())
        elif isinstance(node, dict):
            digest.update(f"dict{type(node).__name__}{len(node)}".encode())
            for key, item in node.items():
                digest.update(repr(key).encode())
                walk(item)
        elif isinstance(node, (list, tuple)):
            digest.update(f"{type(node).__name__}{len(node)}".encode())
            for item in node:
                walk(item)
        elif hasattr(node, "to_dict") and hasattr(node, "batch_size"):  # a TensorDict
            digest.update(f"tensordict{list(node.batch_size)}".encode())
            walk(dict(node.items()))
        else:
            digest.update(repr(node).encode())

    walk(value)
    return digest.hexdigest()

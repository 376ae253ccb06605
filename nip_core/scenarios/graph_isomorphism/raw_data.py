"""The on-disk ("raw") format of graph-isomorphism datasets, as the original library wrote it.

``{data_dir}/graph_isomorphism/{name}/raw/{split}/data.pt`` holds a ``torch.save``d dict:

========================  ==========  ==================================================
key                       dtype       shape / meaning
========================  ==========  ==================================================
``edge_index_a``, ``_b``  int64       ``(2, E)``: per-graph local node indices, each
                                      undirected edge in both directions
``slices_a``, ``_b``      int64       ``(N + 1,)``: cumulative edge counts, first 0
``wl_scores``             int32       ``(N,)``: WL score, -1 for isomorphic pairs
``sizes_a``, ``sizes_b``  int32       ``(N,)``: node counts
``config`` (optional)     dict        the generating config (files written here only)
========================  ==========  ==================================================

Files are written atomically (temporary file + ``os.replace``) and byte-for-byte
deterministically. ``torch.save`` is deterministic for equal content *except* that its
zip archive names every record after the target file's stem (``data/data.pkl`` when
saving to ``data.pt``, ``tmpab12/data.pkl`` when saving to a random temporary name). So
the archive is serialised to memory first — where the stem is always ``archive``, as in
any in-memory ``torch.save`` — and those bytes are written out. (The other varying-looking
record, ``.data/serialization_id``, is derived from the content.)
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nip_core.utils.fileio import atomic_write_bytes

from nip_core.scenarios.graph_isomorphism.errors import GraphIsomorphismDataError
from nip_core.scenarios.graph_isomorphism.graph_utils import dense_to_sparse

__all__ = [
    "RAW_KEYS",
    "GraphIsomorphismDataError",
    "raw_data_path",
    "pairs_to_raw",
    "save_raw",
    "load_raw",
    "validate_raw",
]

#: The tensors every raw file must contain.
RAW_KEYS = (
    "edge_index_a",
    "edge_index_b",
    "slices_a",
    "slices_b",
    "wl_scores",
    "sizes_a",
    "sizes_b",
)


def raw_data_path(data_dir: str | os.PathLike, name: str, split: str) -> Path:
    """``{data_dir}/graph_isomorphism/{name}/raw/{split}/data.pt``."""
    return Path(data_dir, "graph_isomorphism", name, "raw", split, "data.pt")


def pairs_to_raw(
    adjacency: np.ndarray | torch.Tensor,
    sizes: np.ndarray | torch.Tensor,
    wl_scores: np.ndarray | torch.Tensor,
    config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Convert dense pairs to the raw dict.

    Parameters
    ----------
    adjacency : array or Tensor
        ``(N, 2, n, n)`` symmetric 0/1 adjacency matrices of the pairs.
    sizes : array or Tensor
        ``(N,)`` node count of both graphs, or ``(N, 2)`` per graph.
    wl_scores : array or Tensor
        ``(N,)``.
    config : dict, optional
        Stored under ``"config"`` when given (plain Python values only).
    """
    adjacency = torch.as_tensor(np.asarray(adjacency))
    sizes = torch.as_tensor(np.asarray(sizes)).to(torch.int32)
    if sizes.ndim == 1:
        sizes = torch.stack((sizes, sizes), dim=1)
    data: dict[str, Any] = {}
    for column, label in enumerate("ab"):
        edge_index, slices = dense_to_sparse(adjacency[:, column])
        data[f"edge_index_{label}"] = edge_index.contiguous()
        data[f"slices_{label}"] = slices.contiguous()
    data["wl_scores"] = torch.as_tensor(np.asarray(wl_scores)).to(torch.int32).clone()
    data["sizes_a"] = sizes[:, 0].clone()
    data["sizes_b"] = sizes[:, 1].clone()
    if config is not None:
        data["config"] = dict(config)
    return data


def save_raw(data: dict[str, Any], path: str | os.PathLike) -> None:
    """Validate and write ``data`` to ``path`` atomically and deterministically."""
    path = Path(path)
    validate_raw(data, path)
    buffer = io.BytesIO()
    torch.save(data, buffer)
    payload = buffer.getvalue()
    atomic_write_bytes(path, payload)


def load_raw(path: str | os.PathLike) -> dict[str, Any]:
    """Load and validate a raw file (with or without a ``config`` entry).

    Raises
    ------
    GraphIsomorphismDataError
        If the file is missing, unreadable, or fails :func:`validate_raw`.
    """
    path = Path(path)
    if not path.is_file():
        raise GraphIsomorphismDataError(path, "raw data file does not exist")
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - any unpickling failure means a bad file
        raise GraphIsomorphismDataError(path, f"cannot be read by torch.load: {error}") from error
    validate_raw(data, path)
    return data


def validate_raw(data: Any, path: str | os.PathLike | None = None) -> None:
    """Check keys, dtypes, shapes and index ranges of a raw dict.

    Raises
    ------
    GraphIsomorphismDataError
        Naming ``path`` and the first problem found.
    """

    def fail(message: str) -> None:
        raise GraphIsomorphismDataError(path, message)

    if not isinstance(data, dict):
        fail(f"expected a dict, got {type(data).__name__}")
    missing = [key for key in RAW_KEYS if key not in data]
    if missing:
        fail(f"missing keys {missing} (expected {list(RAW_KEYS)})")
    for key in RAW_KEYS:
        value = data[key]
        if not isinstance(value, torch.Tensor):
            fail(f"{key!r} is a {type(value).__name__}, not a tensor")
        if value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
            fail(f"{key!r} has dtype {value.dtype}; an integer dtype is required")
    if "config" in data and not isinstance(data["config"], dict):
        fail(f"'config' is a {type(data['config']).__name__}, not a dict")

    scores = data["wl_scores"]
    if scores.ndim != 1:
        fail(f"'wl_scores' must have shape (N,), got {tuple(scores.shape)}")
    num_pairs = scores.shape[0]
    for label in "ab":
        sizes = data[f"sizes_{label}"]
        if tuple(sizes.shape) != (num_pairs,):
            fail(f"'sizes_{label}' has shape {tuple(sizes.shape)}; expected ({num_pairs},)")
        if num_pairs and int(sizes.min()) < 0:
            fail(f"'sizes_{label}' has a negative size")
        edge_index = data[f"edge_index_{label}"]
        if edge_index.ndim != 2 or edge_index.shape[0] != 2:
            fail(f"'edge_index_{label}' must have shape (2, E), got {tuple(edge_index.shape)}")
        num_edges = edge_index.shape[1]
        slices = data[f"slices_{label}"]
        if tuple(slices.shape) != (num_pairs + 1,):
            fail(f"'slices_{label}' has shape {tuple(slices.shape)}; expected ({num_pairs + 1},)")
        if int(slices[0]) != 0 or int(slices[-1]) != num_edges:
            fail(
                f"'slices_{label}' must run from 0 to the edge count {num_edges}, got "
                f"{int(slices[0])} .. {int(slices[-1])}"
            )
        counts = slices[1:] - slices[:-1]
        if bool((counts < 0).any()):
            fail(f"'slices_{label}' is not non-decreasing")
        if num_edges:
            graph = torch.repeat_interleave(torch.arange(num_pairs), counts.to(torch.int64))
            limit = sizes.to(torch.int64)[graph]
            bad = (edge_index < 0).any(dim=0) | (edge_index >= limit).any(dim=0)
            if bool(bad.any()):
                first = int(torch.nonzero(bad)[0, 0])
                fail(
                    f"'edge_index_{label}' column {first} "
                    f"({int(edge_index[0, first])} -> {int(edge_index[1, first])}) is out "
                    f"of range for pair {int(graph[first])} of size {int(limit[first])}"
                )

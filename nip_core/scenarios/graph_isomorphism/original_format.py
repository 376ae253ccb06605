"""Dataset files of the original library's on-disk format: writing them, and reading any file.

The format (see :mod:`.raw_data`) is a ``torch.save``d dict of torch_geometric-style
collated tensors: ``edge_index_a/b`` ``(2, E)`` with per-graph local node indices,
``slices_a/b`` ``(N + 1,)`` cumulative edge counts, ``wl_scores`` ``(N,)`` and
``sizes_a/b`` ``(N,)``. nipflow's cached datasets use the same layout plus an optional
``config`` entry (the generating config), so one reader serves both.

What this module adds to :mod:`.raw_data`:

* :func:`write_original_format` writes exactly the original keys (no ``config``), from
  dense adjacency matrices or from a :class:`~.dataset.GraphIsomorphismDataset`
  (:func:`dataset_to_raw`);
* :func:`read_dataset_file` reads either kind of file into a dataset, tolerating the
  original converter's habit of dropping trailing edgeless graphs from ``slices``
  (``slices`` shorter than ``N + 1`` whose last value is the edge count is padded with
  that count); ``write_original_format(..., drop_trailing_empty_slices=True)``
  reproduces the habit, so the tolerance can be tested.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nip_core.utils.fileio import atomic_write_bytes
from nip_core.scenarios.graph_isomorphism.raw_data import (
    GraphIsomorphismDataError,
    load_raw,
    pairs_to_raw,
    save_raw,
    validate_raw,
)

__all__ = [
    "dataset_to_raw",
    "write_original_format",
    "read_raw_file",
    "read_dataset_file",
    "pad_short_slices",
]


def dataset_to_raw(dataset) -> dict[str, Any]:
    """The raw dict (original keys only) of a dense dataset.

    Parameters
    ----------
    dataset : GraphIsomorphismDataset
        Or any object whose ``tensordict`` (or ``data``) has ``adjacency``
        ``(N, 2, n, n)``, ``sizes`` ``(N, 2)`` and ``wl_score`` ``(N,)``.

    Raises
    ------
    ValueError
        If one of those keys is missing.
    """
    td = getattr(dataset, "tensordict", None)
    if td is None:
        td = dataset.data
    missing = [key for key in ("adjacency", "sizes", "wl_score") if key not in td.keys()]
    if missing:
        raise ValueError(f"the dataset lacks {missing}; dataset_to_raw needs adjacency, sizes and wl_score")
    return pairs_to_raw(td["adjacency"].cpu(), td["sizes"].cpu(), td["wl_score"].cpu())


def write_original_format(
    path: str | os.PathLike,
    adjacency: np.ndarray | torch.Tensor | None = None,
    sizes: np.ndarray | torch.Tensor | None = None,
    wl_scores: np.ndarray | torch.Tensor | None = None,
    *,
    dataset=None,
    drop_trailing_empty_slices: bool = False,
) -> Path:
    """Write pairs of graphs to ``path`` in the original library's format.

    Give either ``adjacency``, ``sizes`` and ``wl_scores`` (as
    :func:`.raw_data.pairs_to_raw` takes them) or ``dataset``. The file holds exactly the
    keys of :data:`.raw_data.RAW_KEYS` (no ``config``); it is written atomically and
    deterministically.

    Parameters
    ----------
    path : path
        The file to write (its directory is created).
    adjacency, sizes, wl_scores : array or Tensor, optional
        ``(N, 2, n, n)`` symmetric 0/1 matrices, ``(N,)`` or ``(N, 2)`` node counts, ``(N,)``
        WL scores (-1: isomorphic).
    dataset : GraphIsomorphismDataset, optional
        Written instead of the arrays (see :func:`dataset_to_raw`).
    drop_trailing_empty_slices : bool
        Cut the entries of trailing edgeless graphs off ``slices_a/b``, as the original
        library's converter did. Such files are not valid for :func:`.raw_data.load_raw`;
        :func:`read_dataset_file` reads them.

    Returns
    -------
    Path
        ``path``.
    """
    arrays_given = [value is not None for value in (adjacency, sizes, wl_scores)]
    if dataset is not None and any(arrays_given):
        raise ValueError("give either dataset or adjacency/sizes/wl_scores, not both")
    if dataset is None and not all(arrays_given):
        raise ValueError("adjacency, sizes and wl_scores are all required without dataset")
    data = dataset_to_raw(dataset) if dataset is not None else pairs_to_raw(adjacency, sizes, wl_scores)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not drop_trailing_empty_slices:
        save_raw(data, path)
        return path
    validate_raw(data, path)
    for label in "ab":
        slices = data[f"slices_{label}"]
        keep = slices.shape[0]
        while keep > 1 and int(slices[keep - 1]) == int(slices[keep - 2]):
            keep -= 1
        data[f"slices_{label}"] = slices[:keep].clone()
    buffer = io.BytesIO()
    torch.save(data, buffer)
    atomic_write_bytes(path, buffer.getvalue())
    return path


def pad_short_slices(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with ``slices_a/b`` padded to ``N + 1`` entries where the original cut them.

    Only a ``slices`` tensor that is shorter than ``N + 1`` and already ends at the edge
    count is padded (with that count: the missing graphs have no edges); anything else is
    left for :func:`.raw_data.validate_raw` to report.
    """
    if not isinstance(data, dict) or "wl_scores" not in data:
        return data
    scores = data["wl_scores"]
    if not isinstance(scores, torch.Tensor) or scores.ndim != 1:
        return data
    num_pairs = scores.shape[0]
    out = dict(data)
    for label in "ab":
        slices, edge_index = data.get(f"slices_{label}"), data.get(f"edge_index_{label}")
        if not (isinstance(slices, torch.Tensor) and isinstance(edge_index, torch.Tensor)):
            continue
        if slices.ndim != 1 or edge_index.ndim != 2 or not 1 <= slices.shape[0] < num_pairs + 1:
            continue
        num_edges = edge_index.shape[1]
        if int(slices[-1]) != num_edges:
            continue
        pad = torch.full((num_pairs + 1 - slices.shape[0],), num_edges, dtype=slices.dtype)
        out[f"slices_{label}"] = torch.cat((slices, pad))
    return out


def read_raw_file(path: str | os.PathLike) -> dict[str, Any]:
    """Load a dataset file of either kind (original or nipflow) as a validated raw dict.

    Raises
    ------
    GraphIsomorphismDataError
        Naming ``path``: missing, a directory, unreadable, or malformed (e.g. the missing
        keys).
    """
    path = Path(path)
    if path.is_dir():
        raise GraphIsomorphismDataError(path, "is a directory; give the data.pt file inside it")
    try:
        return load_raw(path)
    except GraphIsomorphismDataError as error:
        # Retry only what the original converter may have written (short slices).
        try:
            data = torch.load(path, map_location="cpu", weights_only=True)
        except Exception:  # noqa: BLE001 - report the first, clearer error
            raise error from None
        padded = pad_short_slices(data)
        if padded is data:
            raise
        try:
            validate_raw(padded, path)
        except GraphIsomorphismDataError:
            raise error from None
        return padded


def read_dataset_file(path: str | os.PathLike):
    """A :class:`~.dataset.GraphIsomorphismDataset` of every pair in ``path``.

    Raises
    ------
    GraphIsomorphismDataError
        See :func:`read_raw_file`.
    """
    from nip_core.scenarios.graph_isomorphism.dataset import GraphIsomorphismDataset

    data = read_raw_file(path)
    if int(data["wl_scores"].shape[0]) == 0:
        raise GraphIsomorphismDataError(path, "holds no graph pairs")
    return GraphIsomorphismDataset.from_raw(data, source=path)

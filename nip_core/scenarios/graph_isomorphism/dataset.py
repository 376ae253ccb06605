"""The graph-isomorphism dataset: graph pairs as a dense TensorDict.

Built from a raw file (see :mod:`.raw_data`). The TensorDict has batch size ``(N,)``
(pairs) and keys

=============  =======  ==========================================================
key            dtype    shape / meaning
=============  =======  ==========================================================
``adjacency``  int32    ``(N, 2, max_nodes, max_nodes)``, zero-padded
``node_mask``  bool     ``(N, 2, max_nodes)``: which nodes are real
``y``          int64    ``(N,)``: 1 if the pair is isomorphic (``wl_score == -1``)
``wl_score``   int32    ``(N,)``
``id``         int64    ``(N,)``: index of the pair in the raw file
``sizes``      int32    ``(N, 2)``: node counts
=============  =======  ==========================================================

``max_nodes`` is the largest graph size in the file (8 for "test", 11 for the er*
datasets). The per-round message features ``x`` of the original dataset are left to
the environment, which knows the protocol's shape.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError
from tensordict import TensorDict

from nip_core.scenarios.graph_isomorphism.dataset_generation import (
    GraphIsomorphismDatasetConfig,
)
from nip_core.scenarios.graph_isomorphism.graph_utils import to_dense_adj
from nip_core.scenarios.graph_isomorphism.named_datasets import (
    DatasetConfigMismatchError,
    ensure_named_dataset,
    named_dataset_config,
)
from nip_core.scenarios.graph_isomorphism.raw_data import (
    GraphIsomorphismDataError,
    load_raw,
    validate_raw,
)

__all__ = ["GraphIsomorphismDataset", "SUBSET_SEED"]

#: Seed of the fixed permutation from which ``max_size`` subsets are taken.
SUBSET_SEED = 0


class GraphIsomorphismDataset:
    """Pairs of graphs labelled isomorphic (``y = 1``) or not, backed by a TensorDict.

    Parameters
    ----------
    tensordict : TensorDict
        With the keys of the module docstring and batch size ``(N,)``.
    config : GraphIsomorphismDatasetConfig, optional
        The config the data was generated from, when known.
    source : Path, optional
        The raw file it was read from.
    """

    REQUIRED_KEYS = ("adjacency", "node_mask", "y", "wl_score", "id", "sizes")

    def __init__(
        self,
        tensordict: TensorDict,
        *,
        config: GraphIsomorphismDatasetConfig | None = None,
        source: Path | None = None,
    ):
        missing = [key for key in self.REQUIRED_KEYS if key not in tensordict.keys()]
        if missing or tensordict.batch_dims != 1:
            raise ValueError(
                f"tensordict must have batch size (N,) and keys {list(self.REQUIRED_KEYS)}; "
                f"missing {missing}, batch size {tuple(tensordict.batch_size)}"
            )
        self._tensordict = tensordict
        self.config = config
        self.source = source

    # ----------------------------------------------------------------- constructors

    @classmethod
    def from_raw(
        cls,
        data: dict[str, Any],
        *,
        source: str | os.PathLike | None = None,
        max_size: int | None = None,
    ) -> GraphIsomorphismDataset:
        """Build from a raw dict (as returned by :func:`.raw_data.load_raw`).

        Parameters
        ----------
        data : dict
        source : path, optional
            Named in error messages and kept as ``.source``.
        max_size : int, optional
            Keep at most this many pairs: a subset fixed by :data:`SUBSET_SEED`, in file
            order. (The original kept the *first* pairs, which in its files are all
            non-isomorphic; a seeded subset keeps the class balance.)

        Raises
        ------
        GraphIsomorphismDataError
            If the dict is malformed or its ``config`` entry is invalid.
        """
        validate_raw(data, source)
        config = None
        if "config" in data:
            try:
                config = GraphIsomorphismDatasetConfig.model_validate(data["config"])
            except ValidationError as error:
                raise GraphIsomorphismDataError(
                    source, f"invalid 'config' entry: {error}"
                ) from error

        num_pairs = data["wl_scores"].shape[0]
        sizes = torch.stack((data["sizes_a"], data["sizes_b"]), dim=1).to(torch.int32)
        max_nodes = int(sizes.max()) if num_pairs else 0
        adjacency = torch.stack(
            [
                to_dense_adj(
                    data[f"edge_index_{label}"],
                    data[f"slices_{label}"],
                    sizes[:, column],
                    max_nodes,
                )
                for column, label in enumerate("ab")
            ],
            dim=1,
        )
        node_mask = torch.arange(max_nodes) < sizes[:, :, None]
        wl_score = data["wl_scores"].to(torch.int32)
        tensordict = TensorDict(
            {
                "adjacency": adjacency,
                "node_mask": node_mask,
                "y": (wl_score == -1).to(torch.int64),
                "wl_score": wl_score,
                "id": torch.arange(num_pairs, dtype=torch.int64),
                "sizes": sizes,
            },
            batch_size=[num_pairs],
        )
        if max_size is not None and max_size < num_pairs:
            generator = torch.Generator().manual_seed(SUBSET_SEED)
            keep = torch.randperm(num_pairs, generator=generator)[:max_size].sort().values
            tensordict = tensordict[keep]
        return cls(tensordict, config=config, source=None if source is None else Path(source))

    @classmethod
    def from_path(
        cls, path: str | os.PathLike, *, max_size: int | None = None
    ) -> GraphIsomorphismDataset:
        """Load a raw file, e.g. one published with the original library."""
        return cls.from_raw(load_raw(path), source=path, max_size=max_size)

    @classmethod
    def from_name(
        cls,
        name: str,
        split: str,
        *,
        data_dir: str | os.PathLike | None = None,
        max_size: int | None = None,
    ) -> GraphIsomorphismDataset:
        """Load a named dataset split, generating it into the cache on first use.

        Parameters
        ----------
        name : str
            A registered name (see :mod:`.named_datasets`), or any name whose raw file
            already exists under ``data_dir``.
        split : str
            ``"train"`` or ``"test"``.
        data_dir : path, optional
            Default: :func:`nip_core.settings.default_data_dir` (``$NIPFLOW_DATA_DIR``, else
            ``~/.cache/nipflow/data``).
        max_size : int, optional
            See :meth:`from_raw`.

        Raises
        ------
        UnknownDatasetError
            If the file is missing and the name/split is not registered.
        DatasetConfigMismatchError
            If the cached file records a config other than the registered one.
        """
        path = ensure_named_dataset(name, split, data_dir=data_dir)
        dataset = cls.from_path(path, max_size=max_size)
        if dataset.config is not None:
            try:
                expected = named_dataset_config(name, split)
            except KeyError:
                expected = None  # an unregistered name: the file is the definition
            if expected is not None and dataset.config != expected:
                raise DatasetConfigMismatchError(
                    path,
                    f"was generated from {dataset.config.model_dump()} but dataset "
                    f"{name!r} split {split!r} is registered as {expected.model_dump()}; "
                    "delete the file to regenerate it",
                )
        return dataset

    # ----------------------------------------------------------------- access

    @property
    def tensordict(self) -> TensorDict:
        """The whole dataset."""
        return self._tensordict

    @property
    def max_nodes(self) -> int:
        """Side of the (padded) adjacency matrices."""
        return self._tensordict["adjacency"].shape[-1]

    def __len__(self) -> int:
        return self._tensordict.batch_size[0]

    def __getitem__(self, index: int | slice | torch.Tensor) -> TensorDict:
        """Pairs by position: an int gives a TensorDict of batch size ``()``."""
        return self._tensordict[index]

    def __repr__(self) -> str:
        where = f", source={str(self.source)!r}" if self.source else ""
        return f"{type(self).__name__}(num_pairs={len(self)}, max_nodes={self.max_nodes}{where})"

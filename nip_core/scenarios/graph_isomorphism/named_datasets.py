"""Named graph-isomorphism datasets: registered configs generated into a cache on first use.

Each name maps splits (``"train"``, ``"test"``) to a :class:`GraphIsomorphismDatasetConfig`;
the splits of one name use different seeds. The first request for a split generates it
into ``{data_dir}/graph_isomorphism/{name}/raw/{split}/data.pt``; later requests read
the file. Concurrent first requests are safe: generation runs under an exclusive file
lock (POSIX ``flock``), and the file only appears, complete, through an atomic rename,
so a reader never sees a partial file even where locking is unavailable.

The published data of the original library can be dropped into the same place (or
loaded directly with ``GraphIsomorphismDataset.from_path``): files without a ``config``
entry are used as they are.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from nip_core.settings import DATA_DIR_ENV, default_data_dir  # the one default (user cache)
from nip_core.scenarios.graph_isomorphism.dataset_generation import (
    GraphIsomorphismDatasetConfig,
    generate_gi_dataset,
)
from nip_core.scenarios.graph_isomorphism.errors import GraphIsomorphismDataError

try:  # pragma: no cover - always available on the POSIX machines this runs on
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None

__all__ = [
    "DATA_DIR_ENV",
    "NAMED_DATASETS",
    "UnknownDatasetError",
    "DatasetConfigMismatchError",
    "default_data_dir",
    "register_named_dataset",
    "named_dataset_config",
    "ensure_named_dataset",
    "generate_to_file",
]

logger = logging.getLogger(__name__)


#: what a dataset name may be: one path component below the data directory
DATASET_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")


class UnknownDatasetError(KeyError):
    """No registered dataset has this name, or it has no such split."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


class DatasetConfigMismatchError(GraphIsomorphismDataError):
    """A cached file of a named dataset was generated from a different config."""


def _config(num_samples: int, seed: int, **kwargs) -> GraphIsomorphismDatasetConfig:
    return GraphIsomorphismDatasetConfig(num_samples=num_samples, seed=seed, **kwargs)


# The published "test" data has 50 non-isomorphic pairs split 4 / 10 / 36 by score,
# i.e. two (size, p) cells: sizes 7 and 8 with a single, undocumented edge probability.
_TEST_CELLS = dict(graph_sizes=[7, 8], edge_probabilities=[0.5])

# All non-isomorphic pairs of score 1 (see "easy" below).
_EASY = dict(non_iso_prop_score_1=1.0, non_iso_prop_score_2=0.0)
_WL_SMALL_CELLS = dict(graph_sizes=[7, 8, 9], edge_probabilities=[0.4, 0.6])

#: name -> split -> config.
NAMED_DATASETS: dict[str, dict[str, GraphIsomorphismDatasetConfig]] = {
    "test": {
        "train": _config(100, 1_000, **_TEST_CELLS),
        "test": _config(100, 1_001, **_TEST_CELLS),
    },
    "small": {"train": _config(1_000, 2_000), "test": _config(200, 2_001)},
    # The main job's data: the original's sizes and edge probabilities, but every
    # non-isomorphic pair has WL score 1 (its two graphs already differ in their degree
    # multisets), the easiest class; half the isomorphic pairs reuse those graphs.
    "easy": {"train": _config(2_000, 7_000, **_EASY), "test": _config(500, 7_001, **_EASY)},
    # Hard data that trains on a CPU: the original's Weisfeiler-Lehman quotas (10% of the
    # non-isomorphic pairs with score 1, 20% with score 2, 70% above 2, matched degree
    # multisets for all of those) on smaller graphs (7-9 nodes, p 0.4 or 0.6); generated in
    # about a second.
    "wl-small": {"train": _config(2_000, 7_100, **_WL_SMALL_CELLS), "test": _config(500, 7_101, **_WL_SMALL_CELLS)},
    "er1000": {"train": _config(1_000, 3_000), "test": _config(1_000, 3_001)},
    "er10000": {"train": _config(10_000, 4_000), "test": _config(1_000, 4_001)},
    "eru10000": {"train": _config(10_000, 5_000), "test": _config(1_000, 5_001)},
}


def register_named_dataset(
    name: str,
    splits: Mapping[str, GraphIsomorphismDatasetConfig],
    *,
    overwrite: bool = False,
) -> None:
    """Register ``name`` with a config per split.

    Raises
    ------
    ValueError
        If ``name`` is registered already (unless ``overwrite``) or two splits share
        a seed (they would hold overlapping draws).
    """
    if name in NAMED_DATASETS and not overwrite:
        raise ValueError(f"graph-isomorphism dataset {name!r} is already registered")
    seeds = [config.seed for config in splits.values()]
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"the splits of dataset {name!r} must have different seeds: {seeds}")
    NAMED_DATASETS[name] = dict(splits)


def named_dataset_config(name: str, split: str) -> GraphIsomorphismDatasetConfig:
    """The registered config of ``name``/``split``.

    Raises
    ------
    UnknownDatasetError
    """
    if name not in NAMED_DATASETS:
        raise UnknownDatasetError(
            f"unknown graph-isomorphism dataset {name!r}; registered: {sorted(NAMED_DATASETS)}"
        )
    splits = NAMED_DATASETS[name]
    if split not in splits:
        raise UnknownDatasetError(
            f"graph-isomorphism dataset {name!r} has no split {split!r}; it has {sorted(splits)}"
        )
    return splits[split]


def generate_to_file(
    config: GraphIsomorphismDatasetConfig, path: str | os.PathLike, *, num_workers: int | None = None
) -> Path:
    """Generate ``config`` and save it, with its config, to ``path`` (atomically)."""
    from nip_core.scenarios.graph_isomorphism.raw_data import pairs_to_raw, save_raw  # torch, when writing

    start = time.perf_counter()
    pairs = generate_gi_dataset(config, num_workers=num_workers)
    raw = pairs_to_raw(pairs.adjacency, pairs.sizes, pairs.wl_scores, config.model_dump())
    save_raw(raw, path)
    elapsed = time.perf_counter() - start
    logger.info("wrote %s (%d pairs) in %.1f s", path, config.num_samples, elapsed)
    return Path(path)


def ensure_named_dataset(
    name: str,
    split: str,
    *,
    data_dir: str | os.PathLike | None = None,
    num_workers: int | None = None,
) -> Path:
    """Path of the raw file of ``name``/``split``, generating it first if missing.

    Raises
    ------
    UnknownDatasetError
        If the file is missing and ``name``/``split`` is not registered.
    """
    from nip_core.scenarios.graph_isomorphism.raw_data import raw_data_path  # torch, as every reader of the file

    if not DATASET_NAME_RE.fullmatch(name):
        # the name is a directory under data_dir: a path ('../x', '/x') would read elsewhere
        raise UnknownDatasetError(f"dataset {name!r}: a graph-isomorphism dataset name is one path component "
                                  "(letters, digits, '.', '_', '-', not starting with '.'), not a path")
    path = raw_data_path(default_data_dir() if data_dir is None else data_dir, name, split)
    if path.is_file():
        return path
    config = named_dataset_config(name, split)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive_lock(path.parent / f".{path.name}.lock"):
        if not path.is_file():  # another process may have finished while we waited
            logger.info(
                "generating graph-isomorphism dataset %s/%s (%d pairs) into %s",
                name, split, config.num_samples, path,
            )
            generate_to_file(config, path, num_workers=num_workers)
    return path


@contextlib.contextmanager
def _exclusive_lock(lock_path: Path) -> Iterator[None]:
    if fcntl is None:  # pragma: no cover - atomic rename alone still keeps files whole
        yield
        return
    with open(lock_path, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

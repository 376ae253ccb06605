"""Loading code-validation datasets by name or path.

Registered names:

* ``"nipflow-cv"``: the dataset shipped with the package
  (``data/cv_dataset.jsonl``, built by ``scripts/build_cv_dataset.py``);
* ``"test"``: ten synthetic rows "Question i" / "Solution i" with stance 1 and
  ``y = i % 2``, mirroring the original's "test" dataset (whose labels were random).

A path may point at a JSONL file in the shipped format or at buggy-APPS data (see
:mod:`.buggy_apps`); the format is recognised from the first record's fields.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
from pydantic import ValidationError

from .buggy_apps import read_buggy_apps, resolve_split_file
from .records import (
    CodeValidationDatapoint,
    DatasetFormatError,
    UnknownDatasetError,
    check_split,
)

__all__ = [
    "SHIPPED_DATASET_PATH",
    "CodeValidationDataset",
    "dataset_names",
    "load_dataset",
    "read_jsonl_dataset",
    "register_dataset",
]

SHIPPED_DATASET_PATH = Path(__file__).resolve().parent.parent / "data" / "cv_dataset.jsonl"

DatasetFactory = Callable[[str], list[CodeValidationDatapoint]]
_REGISTRY: dict[str, DatasetFactory] = {}


def register_dataset(name: str) -> Callable[[DatasetFactory], DatasetFactory]:
    """Register ``factory(split) -> list of datapoints`` under ``name``."""

    def decorator(factory: DatasetFactory) -> DatasetFactory:
        if name in _REGISTRY:
            raise ValueError(f"dataset {name!r} is already registered")
        _REGISTRY[name] = factory
        return factory

    return decorator


def dataset_names() -> list[str]:
    """Names accepted by :meth:`CodeValidationDataset.from_name`."""
    return sorted(_REGISTRY)


class CodeValidationDataset:
    """An ordered, immutable collection of :class:`CodeValidationDatapoint`.

    Parameters
    ----------
    datapoints : sequence of CodeValidationDatapoint
        The rows, in order.
    name : str
        Registered name or source path (for display).
    split : {"train", "test"}
        The split the rows belong to.
    """

    def __init__(self, datapoints: Sequence[CodeValidationDatapoint], *, name: str, split: str) -> None:
        self.name = name
        self.split = check_split(split)
        self._datapoints: tuple[CodeValidationDatapoint, ...] = tuple(datapoints)

    @classmethod
    def from_name(cls, name: str, split: str, *, max_size: int | None = None) -> CodeValidationDataset:
        """Load a registered dataset.

        Parameters
        ----------
        name : str
            One of :func:`dataset_names` (``"nipflow-cv"``, ``"test"``).
        split : {"train", "test"}
            Which split.
        max_size : int, optional
            Keep only the first ``max_size`` rows.

        Raises
        ------
        UnknownDatasetError
            If ``name`` is not registered.
        InvalidSplitError
            If ``split`` is not "train" or "test".
        """
        check_split(split)
        if name not in _REGISTRY:
            raise UnknownDatasetError(
                f"unknown code-validation dataset {name!r}; registered: {dataset_names()}"
            )
        return cls(_truncate(_REGISTRY[name](split), max_size), name=name, split=split)

    @property
    def datapoints(self) -> tuple[CodeValidationDatapoint, ...]:
        """All rows."""
        return self._datapoints

    @property
    def labels(self) -> np.ndarray:
        """The labels ``y`` as an int64 array of shape ``(len(self),)``."""
        return np.array([dp.y for dp in self._datapoints], dtype=np.int64)

    @property
    def problem_ids(self) -> list[str]:
        """The distinct problem ids, in order of first appearance."""
        return list(dict.fromkeys(dp.problem_id for dp in self._datapoints))

    def __len__(self) -> int:
        return len(self._datapoints)

    def __getitem__(self, index: int) -> CodeValidationDatapoint:
        if not isinstance(index, (int, np.integer)):
            raise TypeError(f"dataset indices must be integers, not {type(index).__name__}")
        return self._datapoints[int(index)]

    def __iter__(self) -> Iterator[CodeValidationDatapoint]:
        return iter(self._datapoints)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, split={self.split!r}, num_rows={len(self)})"


def _truncate(rows: list[CodeValidationDatapoint], max_size: int | None) -> list[CodeValidationDatapoint]:
    if max_size is not None and max_size < 0:
        raise ValueError(f"max_size must be non-negative, got {max_size}")
    return rows if max_size is None else rows[:max_size]


def read_jsonl_dataset(path: str | Path, split: str) -> list[CodeValidationDatapoint]:
    """Read the rows of ``split`` from a JSONL file in the shipped format.

    Raises
    ------
    DatasetFormatError
        If a line is not valid JSON or not a valid datapoint (message names the file
        and line).
    """
    check_split(split)
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetFormatError(f"{path}: cannot read: {exc}") from exc
    rows = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = CodeValidationDatapoint.model_validate(json.loads(line))
        except json.JSONDecodeError as exc:
            raise DatasetFormatError(f"{path}: line {lineno}: invalid JSON: {exc.msg}") from exc
        except ValidationError as exc:
            fields = ", ".join(".".join(map(str, e["loc"])) or "<record>" for e in exc.errors())
            message = f"{path}: line {lineno}: invalid datapoint (fields: {fields}): {exc}"
            raise DatasetFormatError(message) from exc
        if row.split == split:
            rows.append(row)
    return rows


def _first_record(file: Path) -> dict | None:
    text = file.read_text(encoding="utf-8")
    try:
        if file.suffix == ".jsonl":
            first = next((line for line in text.splitlines() if line.strip()), None)
            return json.loads(first) if first is not None else None
        data = json.loads(text)
    except json.JSONDecodeError:
        return None  # let the format-specific reader report the error with its line
    if isinstance(data, dict):
        data = next((v for v in data.values() if isinstance(v, list)), None)
    return data[0] if isinstance(data, list) and data and isinstance(data[0], dict) else None


def load_dataset(
    name_or_path: str | Path,
    split: str,
    *,
    max_size: int | None = None,
    apps_difficulty: str = "interview",
    exclude_flagged: bool = True,
) -> CodeValidationDataset:
    """Load a dataset by registered name or from a local path.

    Parameters
    ----------
    name_or_path : str or Path
        A registered name (see :func:`dataset_names`) or a path to a shipped-format
        JSONL file or to buggy-APPS data (file or directory of ``{split}.json[l]``).
    split : {"train", "test"}
        Which split.
    max_size : int, optional
        Keep only the first ``max_size`` rows.
    apps_difficulty, exclude_flagged
        Filters for buggy-APPS data (ignored otherwise).

    Returns
    -------
    CodeValidationDataset

    Raises
    ------
    UnknownDatasetError
        If the name is not registered and no such path exists.
    DatasetFormatError
        If the file is malformed.
    """
    check_split(split)
    if isinstance(name_or_path, str) and name_or_path in _REGISTRY:
        return CodeValidationDataset.from_name(name_or_path, split, max_size=max_size)
    path = Path(name_or_path)
    if not path.exists():
        raise UnknownDatasetError(
            f"{str(name_or_path)!r} is neither a registered dataset {dataset_names()} nor an existing path"
        )
    file = resolve_split_file(path, split)
    first = _first_record(file) or {}
    if "buggy_solutions" in first or "solutions" in first:
        rows = read_buggy_apps(
            file, split, apps_difficulty=apps_difficulty, exclude_flagged=exclude_flagged
        )
    else:
        rows = read_jsonl_dataset(file, split)
    return CodeValidationDataset(_truncate(rows, max_size), name=str(path), split=split)


@register_dataset("nipflow-cv")
def _shipped(split: str) -> list[CodeValidationDatapoint]:
    if not SHIPPED_DATASET_PATH.is_file():
        raise DatasetFormatError(
            f"{SHIPPED_DATASET_PATH}: shipped dataset missing; run scripts/build_cv_dataset.py"
        )
    return read_jsonl_dataset(SHIPPED_DATASET_PATH, split)


@register_dataset("test")
def _synthetic(split: str) -> list[CodeValidationDatapoint]:
    return [
        CodeValidationDatapoint(
            id=i,
            problem_id=f"test-{i}",
            question=f"Question {i}",
            solution=f"Solution {i}",
            y=i % 2,
            prover_stance=1,
            split=split,
            mutation=None,
            difficulty="introductory",
        )
        for i in range(10)
    ]

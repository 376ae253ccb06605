"""The datapoint record of the code-validation scenario and the dataset errors."""

from __future__ import annotations

import hashlib
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "SPLITS",
    "CodeValidationDatapoint",
    "DatasetError",
    "DatasetFormatError",
    "InvalidSplitError",
    "UnknownDatasetError",
    "check_split",
    "get_hash_parity",
]

SPLITS: tuple[str, ...] = ("train", "test")


class DatasetError(Exception):
    """Base class of the code-validation dataset errors."""


class DatasetFormatError(DatasetError, ValueError):
    """A dataset file is malformed; the message names the file and line or record."""


class UnknownDatasetError(DatasetError, KeyError):
    """No registered dataset has this name and no file exists at this path."""

    def __str__(self) -> str:  # KeyError would add quotes around the message
        return str(self.args[0]) if self.args else ""


class InvalidSplitError(DatasetError, ValueError):
    """The split is not one of :data:`SPLITS`."""


def get_hash_parity(text: str) -> int:
    """Parity of the SHA-256 digest of ``text``: the original's prover stance."""
    return int(hashlib.sha256(text.encode("utf-8")).hexdigest(), 16) % 2


def check_split(split: str) -> str:
    """Return ``split`` if it is ``"train"`` or ``"test"``, else raise InvalidSplitError."""
    if split not in SPLITS:
        raise InvalidSplitError(f"unknown split {split!r}; expected one of {list(SPLITS)}")
    return split


class CodeValidationDatapoint(BaseModel):
    """One (question, candidate solution) pair with its correctness label.

    Attributes
    ----------
    id : int
        Identifier of the row within its source (unique across both splits for the
        shipped dataset; ``0..n-1`` per split for buggy-APPS files, as in the original).
    problem_id : str
        The programming problem; all variants of a problem share it.
    question : str
        The problem statement shown to the agents.
    solution : str
        The candidate Python program.
    y : {0, 1}
        1 if the solution is correct, 0 if it is buggy.
    prover_stance : {0, 1}
        The verdict a single prover argues for: SHA-256 parity of ``solution``.
    split : {"train", "test"}
        The split the row belongs to.
    mutation : str or None
        Mutation operator that produced a buggy solution; ``None`` for correct
        solutions and for external data whose bugs are not annotated.
    difficulty : str
        APPS-style difficulty label of the problem.
    mutation_description : str or None
        Human-readable description of the mutation (where known).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: int
    problem_id: str
    question: str
    solution: str
    y: Literal[0, 1]
    prover_stance: Literal[0, 1]
    split: Literal["train", "test"]
    mutation: str | None = None
    difficulty: str
    mutation_description: str | None = Field(default=None)

"""The bank of stdin→stdout programming problems the dataset is built from.

The problems are original, written for this project in the style of APPS
(statement, input format, output format, examples). They live as YAML files under
``nip_core/scenarios/code_validation/data/problems/``; YAML block scalars keep the
reference solutions readable and diffable.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .sandbox import TestCase

__all__ = [
    "PROBLEMS_DIR",
    "ProblemBankError",
    "ProblemSpec",
    "load_problems",
    "render_question",
]

PROBLEMS_DIR = Path(__file__).resolve().parent.parent / "data" / "problems"

Difficulty = Literal["introductory", "interview", "competition"]


class ProblemBankError(ValueError):
    """A problem file is malformed (the message names the file and problem)."""


class ProblemSpec(BaseModel):
    """One programming problem with its correct solutions and test cases.

    Attributes
    ----------
    id : str
        Stable identifier, e.g. ``"cv-001"``.
    title, statement, input_format, output_format : str
        The problem text.
    difficulty : {"introductory", "interview", "competition"}
        APPS-style difficulty label.
    solutions : list of str
        Correct programs; the first is the reference solution.
    tests : list of TestCase
        stdin→stdout cases. Inputs always end with a newline.
    num_examples : int
        How many leading test cases are shown as examples in the question.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    title: str
    difficulty: Difficulty
    statement: str
    input_format: str
    output_format: str
    solutions: list[str] = Field(min_length=1)
    tests: list[TestCase] = Field(min_length=1)
    num_examples: int = Field(default=1, ge=1)

    @field_validator("tests", mode="before")
    @classmethod
    def _pairs_to_cases(cls, value: object) -> object:
        if not isinstance(value, list):
            return value
        cases = []
        for item in value:
            if isinstance(item, (list, tuple)) and len(item) == 2:
                stdin, stdout = (str(x) for x in item)
                if not stdin.endswith("\n"):
                    stdin += "\n"
                cases.append({"input": stdin, "output": stdout})
            else:
                cases.append(item)
        return cases


def render_question(problem: ProblemSpec) -> str:
    """The problem as the verifier sees it, in the APPS layout.

    Parameters
    ----------
    problem : ProblemSpec
        The problem.

    Returns
    -------
    str
        Statement, ``-----Input-----`` and ``-----Output-----`` sections and the
        examples.
    """
    parts = [
        problem.statement.strip(),
        "-----Input-----",
        problem.input_format.strip(),
        "-----Output-----",
        problem.output_format.strip(),
        "-----Examples-----" if problem.num_examples > 1 else "-----Example-----",
    ]
    examples = []
    for case in problem.tests[: problem.num_examples]:
        examples.append(f"Input\n{case.input.rstrip()}\n\nOutput\n{case.output.rstrip()}")
    return "\n\n".join(parts) + "\n" + "\n\n".join(examples) + "\n"


def _load_file(path: Path) -> list[ProblemSpec]:
    try:
        records = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ProblemBankError(f"{path}: invalid YAML: {exc}") from exc
    if not isinstance(records, list):
        raise ProblemBankError(f"{path}: expected a list of problems, got {type(records).__name__}")
    problems = []
    for k, record in enumerate(records):
        label = record.get("id", f"#{k}") if isinstance(record, dict) else f"#{k}"
        try:
            problems.append(ProblemSpec.model_validate(record))
        except ValidationError as exc:
            fields = ", ".join(".".join(map(str, e["loc"])) or "<record>" for e in exc.errors())
            raise ProblemBankError(f"{path}: problem {label}: invalid field(s) {fields}: {exc}") from exc
    return problems


@lru_cache(maxsize=4)
def _load_dir(directory: str) -> tuple[ProblemSpec, ...]:
    problems: list[ProblemSpec] = []
    for path in sorted(Path(directory).glob("*.yaml")):
        problems.extend(_load_file(path))
    seen: set[str] = set()
    for problem in problems:
        if problem.id in seen:
            raise ProblemBankError(f"{directory}: duplicate problem id {problem.id!r}")
        seen.add(problem.id)
    return tuple(sorted(problems, key=lambda p: p.id))


def load_problems(directory: str | Path | None = None) -> list[ProblemSpec]:
    """Load every problem of the bank, sorted by id.

    Parameters
    ----------
    directory : str or Path, optional
        Folder of ``*.yaml`` problem files (default: the shipped bank).

    Returns
    -------
    list of ProblemSpec

    Raises
    ------
    ProblemBankError
        If a file is not valid YAML, a problem misses a field, or ids repeat.
    """
    return list(_load_dir(str(Path(directory or PROBLEMS_DIR).resolve())))

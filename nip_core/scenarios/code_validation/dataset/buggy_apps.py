"""Reader for local files in the "buggy APPS" record format of the original library.

Each record has the fields ``problem_id``, ``question``, ``solutions``,
``buggy_solutions``, ``difficulty`` and ``flags``. ``solutions`` and
``buggy_solutions`` are lists of objects with a ``"solution"`` string (other keys are
ignored), or a JSON string encoding such a list; plain strings are accepted as list
entries too.

Row order follows the original: all correct rows first, grouped by solution index
(every kept record's solution 0, then every solution 1, ...), then the buggy rows in
the same way; ids are ``0..n-1``.

Deviation from the original (docs/behaviour.md#b38): buggy solutions are taken while
``len(buggy_solutions) > k``; the original tested ``len(solutions) > k``, which
dropped buggy solutions of records with fewer correct than buggy solutions and failed
on records with more.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

from .records import CodeValidationDatapoint, DatasetFormatError, check_split, get_hash_parity

__all__ = ["REQUIRED_FIELDS", "read_buggy_apps", "resolve_split_file"]

REQUIRED_FIELDS: tuple[str, ...] = (
    "problem_id",
    "question",
    "solutions",
    "buggy_solutions",
    "difficulty",
    "flags",
)


def resolve_split_file(path: Path, split: str) -> Path:
    """The file to read: ``path`` itself, or ``path/{split}.jsonl`` / ``.json``."""
    if path.is_dir():
        for suffix in (".jsonl", ".json"):
            candidate = path / f"{split}{suffix}"
            if candidate.is_file():
                return candidate
        raise DatasetFormatError(f"{path}: directory has no {split}.jsonl or {split}.json")
    return path


def _iter_records(path: Path, split: str) -> Iterator[tuple[str, Any]]:
    """Yield (location, record) pairs; location is "line N" or "record N"."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetFormatError(f"{path}: cannot read: {exc}") from exc
    if path.suffix == ".jsonl":
        for lineno, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                yield f"line {lineno}", json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetFormatError(f"{path}: line {lineno}: invalid JSON: {exc.msg}") from exc
        return
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DatasetFormatError(f"{path}: invalid JSON at line {exc.lineno}: {exc.msg}") from exc
    if isinstance(data, dict) and split in data:
        data = data[split]
    if not isinstance(data, list):
        raise DatasetFormatError(
            f"{path}: expected a JSON list of records (or an object with a {split!r} list)"
        )
    for index, record in enumerate(data):
        yield f"record {index}", record


def _solution_list(value: Any, field: str, where: str) -> list[str]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            message = f"{where}: field {field!r} is a string but not valid JSON: {exc.msg}"
            raise DatasetFormatError(message) from exc
    if not isinstance(value, list):
        raise DatasetFormatError(f"{where}: field {field!r} must be a list, got {type(value).__name__}")
    out = []
    for k, entry in enumerate(value):
        if isinstance(entry, dict) and isinstance(entry.get("solution"), str):
            out.append(entry["solution"])
        elif isinstance(entry, str):
            out.append(entry)
        else:
            raise DatasetFormatError(f"{where}: {field}[{k}] has no string 'solution'")
    return out


def _parse_record(record: Any, where: str) -> dict[str, Any]:
    if not isinstance(record, dict):
        raise DatasetFormatError(f"{where}: expected a JSON object, got {type(record).__name__}")
    missing = [f for f in REQUIRED_FIELDS if f not in record]
    if missing:
        raise DatasetFormatError(f"{where}: missing field(s) {missing}")
    for field in ("question", "difficulty"):
        if not isinstance(record[field], str):
            raise DatasetFormatError(f"{where}: field {field!r} must be a string")
    flags = record["flags"]
    if flags is not None and not isinstance(flags, str):
        raise DatasetFormatError(f"{where}: field 'flags' must be a string or null")
    return {
        "problem_id": str(record["problem_id"]),
        "question": record["question"],
        "difficulty": record["difficulty"],
        "flags": flags or "",
        "solutions": _solution_list(record["solutions"], "solutions", where),
        "buggy_solutions": _solution_list(record["buggy_solutions"], "buggy_solutions", where),
    }


def read_buggy_apps(
    path: str | Path,
    split: str,
    *,
    apps_difficulty: str = "interview",
    exclude_flagged: bool = True,
    max_size: int | None = None,
) -> list[CodeValidationDatapoint]:
    """Read a buggy-APPS file into datapoints.

    Parameters
    ----------
    path : str or Path
        A ``.jsonl`` file (one record per line), a ``.json`` file (a list of records,
        or an object whose ``split`` key holds the list), or a directory holding
        ``{split}.jsonl`` or ``{split}.json``.
    split : {"train", "test"}
        The split (recorded on every datapoint; selects the file in a directory).
    apps_difficulty : str
        Keep only records with this difficulty.
    exclude_flagged : bool
        Drop records whose ``flags`` is non-empty (``null`` counts as empty).
    max_size : int, optional
        Keep only the first ``max_size`` rows.

    Returns
    -------
    list of CodeValidationDatapoint

    Raises
    ------
    DatasetFormatError
        If the file cannot be read or a record is malformed; the message names the
        file and the line (JSONL) or record index (JSON).
    """
    check_split(split)
    file = resolve_split_file(Path(path), split)
    kept = []
    for location, raw in _iter_records(file, split):
        record = _parse_record(raw, f"{file}: {location}")
        if record["difficulty"] != apps_difficulty:
            continue
        if exclude_flagged and record["flags"] != "":
            continue
        kept.append(record)

    rows: list[tuple[dict[str, Any], str, int]] = []
    for field, label in (("solutions", 1), ("buggy_solutions", 0)):
        depth = max((len(r[field]) for r in kept), default=0)
        for k in range(depth):
            rows.extend((r, r[field][k], label) for r in kept if len(r[field]) > k)
    if max_size is not None:
        rows = rows[:max_size]
    return [
        CodeValidationDatapoint(
            id=i,
            problem_id=record["problem_id"],
            question=record["question"],
            solution=solution,
            y=label,
            prover_stance=get_hash_parity(solution),
            split=split,
            mutation=None,
            difficulty=record["difficulty"],
        )
        for i, (record, solution, label) in enumerate(rows)
    ]

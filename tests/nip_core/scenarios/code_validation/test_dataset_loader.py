"""Tests of the dataset loaders: registered names, shipped-format files, buggy APPS."""

import json

import numpy as np
import pytest

from nip_core.scenarios.code_validation.dataset.buggy_apps import read_buggy_apps
from nip_core.scenarios.code_validation.dataset.loader import (
    CodeValidationDataset,
    dataset_names,
    load_dataset,
    read_jsonl_dataset,
)
from nip_core.scenarios.code_validation.dataset.records import (
    CodeValidationDatapoint,
    DatasetFormatError,
    InvalidSplitError,
    UnknownDatasetError,
    get_hash_parity,
)


def test_registered_names():
    assert dataset_names() == ["nipflow-cv", "test"]


def test_synthetic_test_dataset_mirrors_the_original():
    ds = CodeValidationDataset.from_name("test", "train")
    assert len(ds) == 10
    assert [dp.question for dp in ds] == [f"Question {i}" for i in range(10)]
    assert [dp.solution for dp in ds] == [f"Solution {i}" for i in range(10)]
    assert {dp.prover_stance for dp in ds} == {1}
    np.testing.assert_array_equal(ds.labels, np.array([0, 1] * 5))
    assert ds.labels.dtype == np.int64
    assert CodeValidationDataset.from_name("test", "test")[3].split == "test"
    assert len(CodeValidationDataset.from_name("test", "train", max_size=4)) == 4


def test_unknown_name_and_bad_split():
    with pytest.raises(UnknownDatasetError, match="nope"):
        CodeValidationDataset.from_name("nope", "train")
    with pytest.raises(InvalidSplitError, match="validation"):
        CodeValidationDataset.from_name("test", "validation")
    with pytest.raises(UnknownDatasetError, match="neither a registered dataset"):
        load_dataset("/no/such/file.jsonl", "train")


def test_indexing_and_iteration():
    ds = CodeValidationDataset.from_name("test", "train")
    assert ds[np.int64(2)].id == 2
    assert ds[-1].id == 9
    assert [dp.id for dp in ds] == list(range(10))
    with pytest.raises(TypeError):
        ds["question"]
    with pytest.raises(IndexError):
        ds[10]
    assert repr(ds) == "CodeValidationDataset(name='test', split='train', num_rows=10)"


def _row(i: int, split: str, y: int) -> dict:
    solution = f"print({i})\n"
    return dict(
        id=i, problem_id=f"p{i // 2}", question="Q", solution=solution, y=y, split=split,
        prover_stance=get_hash_parity(solution), mutation=None if y else "comparison_flip",
        mutation_description=None if y else "line 1: x", difficulty="introductory",
    )  # fmt: skip


def test_shipped_format_file_round_trip(tmp_path):
    path = tmp_path / "mine.jsonl"
    rows = [_row(0, "train", 1), _row(1, "train", 0), _row(2, "test", 1)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    train = load_dataset(path, "train")
    assert [dp.id for dp in train] == [0, 1]
    assert train[1] == CodeValidationDatapoint(**rows[1])
    assert [dp.id for dp in load_dataset(str(path), "test")] == [2]


def test_shipped_format_errors_name_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    bad = _row(1, "train", 0)
    bad["y"] = 3
    path.write_text(json.dumps(_row(0, "train", 1)) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(DatasetFormatError, match=r"bad\.jsonl: line 2: invalid datapoint \(fields: y\)"):
        read_jsonl_dataset(path, "train")
    path.write_text(json.dumps(_row(0, "train", 1)) + "\n{not json\n")
    with pytest.raises(DatasetFormatError, match=r"bad\.jsonl: line 2: invalid JSON"):
        read_jsonl_dataset(path, "train")


# --- buggy APPS ------------------------------------------------------------------------


def _apps(pid, correct, buggy, difficulty="interview", flags="", as_string=False):
    def wrap(xs):
        entries = [{"solution": s, "levenshtein_distance": 3} for s in xs]
        return json.dumps(entries) if as_string else entries

    return {
        "problem_id": pid,
        "question": f"Question {pid}",
        "solutions": wrap(correct),
        "buggy_solutions": wrap(buggy),
        "difficulty": difficulty,
        "flags": flags,
    }


APPS_RECORDS = [
    _apps(10, ["a0", "a1"], ["A0"]),  # more correct than buggy
    _apps(11, ["b0"], ["B0", "B1", "B2"], as_string=True),  # more buggy than correct (quirk 16)
    _apps(12, ["c0"], ["C0"], difficulty="competition"),
    _apps(13, ["d0"], ["D0"], flags="violence"),
    _apps(14, ["e0", "e1", "e2"], []),
]


@pytest.fixture
def apps_file(tmp_path):
    path = tmp_path / "buggy_apps.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in APPS_RECORDS) + "\n")
    return path


def test_buggy_apps_rows_order_and_quirk16_fix(apps_file):
    rows = read_buggy_apps(apps_file, "train")
    assert [(dp.solution, dp.y) for dp in rows] == [
        ("a0", 1), ("b0", 1), ("e0", 1), ("a1", 1), ("e1", 1), ("e2", 1),
        ("A0", 0), ("B0", 0), ("B1", 0), ("B2", 0),
    ]  # fmt: skip
    assert [dp.id for dp in rows] == list(range(10))
    assert [dp.problem_id for dp in rows[:3]] == ["10", "11", "14"]
    assert rows[7].question == "Question 11"
    assert all(dp.prover_stance == get_hash_parity(dp.solution) for dp in rows)
    assert {dp.split for dp in rows} == {"train"}
    assert {dp.difficulty for dp in rows} == {"interview"}


def test_buggy_apps_filters(apps_file):
    competition = read_buggy_apps(apps_file, "test", apps_difficulty="competition")
    assert [(dp.solution, dp.y, dp.split) for dp in competition] == [("c0", 1, "test"), ("C0", 0, "test")]
    with_flagged = read_buggy_apps(apps_file, "train", exclude_flagged=False)
    assert "d0" in [dp.solution for dp in with_flagged]
    assert "D0" in [dp.solution for dp in with_flagged]
    assert len(read_buggy_apps(apps_file, "train", max_size=3)) == 3


def test_load_dataset_recognises_buggy_apps_files_and_directories(apps_file, tmp_path):
    ds = load_dataset(apps_file, "train", max_size=5)
    assert len(ds) == 5 and ds.labels.tolist() == [1, 1, 1, 1, 1]
    folder = tmp_path / "apps"
    folder.mkdir()
    (folder / "test.json").write_text(json.dumps(APPS_RECORDS[:2]))
    ds = load_dataset(folder, "test")
    assert [dp.solution for dp in ds] == ["a0", "b0", "a1", "A0", "B0", "B1", "B2"]
    with pytest.raises(DatasetFormatError, match="no train.jsonl or train.json"):
        load_dataset(folder, "train")


def test_buggy_apps_json_object_with_splits(tmp_path):
    path = tmp_path / "both.json"
    path.write_text(json.dumps({"train": APPS_RECORDS[:1], "test": APPS_RECORDS[1:2]}))
    assert [dp.solution for dp in read_buggy_apps(path, "test")] == ["b0", "B0", "B1", "B2"]


def test_buggy_apps_missing_field_names_file_and_line(tmp_path):
    path = tmp_path / "broken.jsonl"
    record = dict(APPS_RECORDS[0])
    del record["flags"]
    path.write_text(json.dumps(APPS_RECORDS[1]) + "\n\n" + json.dumps(record) + "\n")
    with pytest.raises(DatasetFormatError, match=r"broken\.jsonl: line 3: missing field\(s\) \['flags'\]"):
        read_buggy_apps(path, "train")


def test_buggy_apps_malformed_records(tmp_path):
    path = tmp_path / "broken.json"
    record = dict(APPS_RECORDS[0], buggy_solutions=[{"code": "x"}])
    path.write_text(json.dumps([APPS_RECORDS[1], record]))
    with pytest.raises(DatasetFormatError, match=r"broken\.json: record 1: buggy_solutions\[0\] has no string 'solution'"):
        read_buggy_apps(path, "train")
    path.write_text(json.dumps([dict(APPS_RECORDS[0], solutions="[{not json")]))
    with pytest.raises(DatasetFormatError, match=r"record 0: field 'solutions' is a string but not valid JSON"):
        read_buggy_apps(path, "train")
    path.write_text("[1, 2")
    with pytest.raises(DatasetFormatError, match=r"broken\.json: invalid JSON at line 1"):
        read_buggy_apps(path, "train")
    jsonl = tmp_path / "broken.jsonl"
    jsonl.write_text(json.dumps(APPS_RECORDS[0]) + "\n[1, 2]\n")
    with pytest.raises(DatasetFormatError, match=r"broken\.jsonl: line 2: expected a JSON object"):
        read_buggy_apps(jsonl, "train")

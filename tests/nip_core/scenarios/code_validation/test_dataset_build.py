"""Tests of the deterministic dataset builder, on a small fixture bank."""

import hashlib
import json

import pytest

from nip_core.scenarios.code_validation.dataset.build import (
    DATASET_FILENAME,
    MANIFEST_FILENAME,
    BuildConfig,
    build_dataset,
    serialise_items,
    write_dataset,
)
from nip_core.scenarios.code_validation.dataset.mutations import MUTATION_OPERATORS
from nip_core.scenarios.code_validation.dataset.problems import ProblemBankError, ProblemSpec
from nip_core.scenarios.code_validation.dataset.records import get_hash_parity
from nip_core.scenarios.code_validation.dataset.sandbox import check_solution


def _problem(pid: str, solutions: list[str], tests: list[tuple[str, str]]) -> ProblemSpec:
    return ProblemSpec(
        id=pid,
        title=pid,
        difficulty="introductory",
        statement=f"Statement of {pid}.",
        input_format="See the statement.",
        output_format="One integer.",
        solutions=solutions,
        tests=tests,
    )


BANK = [
    _problem(
        "fx-max",
        [
            "n = int(input())\na = list(map(int, input().split()))\nbest = a[0]\n"
            "for x in a[1:]:\n    if x > best:\n        best = x\nprint(best)\n",
            "input()\nprint(max(map(int, input().split())))\n",
        ],
        [("3\n1 5 2", "5"), ("1\n-4", "-4"), ("4\n7 7 7 7", "7"), ("3\n9 1 2", "9"), ("2\n-1 -2", "-1"), ("5\n1 2 3 4 5", "5")],
    ),
    _problem(
        "fx-evens",
        [
            "n = int(input())\na = list(map(int, input().split()))\nc = 0\n"
            "for i in range(n):\n    if a[i] % 2 == 0:\n        c += 1\nprint(c)\n",
            "input()\nprint(sum(1 for x in input().split() if int(x) % 2 == 0))\n",
        ],
        [("4\n1 2 3 4", "2"), ("1\n7", "0"), ("3\n2 4 6", "3"), ("5\n0 1 1 1 8", "2"), ("2\n-2 3", "1"), ("3\n5 6 7", "1")],
    ),
    _problem(
        "fx-triangle",
        [
            "n = int(input())\ntotal = 0\nfor k in range(1, n + 1):\n    total += k\nprint(total)\n",
            "n = int(input())\nprint(n * (n + 1) // 2)\n",
        ],
        [("4", "10"), ("1", "1"), ("0", "0"), ("2", "3"), ("10", "55"), ("100", "5050")],
    ),
]

CONFIG = BuildConfig(seed=7, test_fraction=0.34)


@pytest.fixture(scope="module")
def built():
    return build_dataset(CONFIG, problems=BANK, workers=3)


def test_same_seed_gives_identical_bytes(built):
    again = build_dataset(CONFIG, problems=BANK, workers=1)  # worker count must not matter
    assert serialise_items(again.items) == serialise_items(built.items)
    assert again.manifest == built.manifest


def test_split_is_by_problem_and_ids_are_sequential(built):
    items = built.items
    assert [item.id for item in items] == list(range(len(items)))
    splits = [item.split for item in items]
    assert splits == sorted(splits, key=["train", "test"].index)  # train rows first
    train = {i.problem_id for i in items if i.split == "train"}
    test = {i.problem_id for i in items if i.split == "test"}
    assert train.isdisjoint(test)
    assert len(test) == 1 and len(train) == 2
    assert built.manifest["problems"] == {"train": sorted(train), "test": sorted(test)}


def test_each_problem_is_balanced(built):
    for problem in BANK:
        labels = [i.y for i in built.items if i.problem_id == problem.id]
        assert labels.count(1) == len(problem.solutions)
        assert labels.count(0) == len(problem.solutions)
    assert built.manifest["counts"]["train"]["correct"] == built.manifest["counts"]["train"]["buggy"] == 4
    assert built.manifest["num_items"] == 12
    assert built.manifest["problems_short_of_buggy_variants"] == []


def test_item_fields(built):
    names = {op.name for op in MUTATION_OPERATORS}
    by_id = {p.id: p for p in BANK}
    for item in built.items:
        problem = by_id[item.problem_id]
        assert item.prover_stance == get_hash_parity(item.solution)
        assert item.question.startswith(problem.statement.strip())
        assert "-----Input-----" in item.question and "-----Example-----" in item.question
        if item.y == 1:
            assert item.solution in problem.solutions
            assert item.mutation is None and item.mutation_description is None
        else:
            assert item.solution not in problem.solutions
            assert item.mutation in names
            assert item.mutation_description.startswith("line ")


def test_labels_are_verified_by_execution(built):
    by_id = {p.id: p for p in BANK}
    for item in built.items:
        result = check_solution(item.solution, by_id[item.problem_id].tests)
        if item.y == 1:
            assert result.all_passed
        else:
            assert result.passed < result.total and result.timeouts == 0


def test_write_dataset_records_hash_and_counts(built, tmp_path):
    dataset_path, manifest_path = write_dataset(built, tmp_path)
    assert dataset_path == tmp_path / DATASET_FILENAME
    assert manifest_path == tmp_path / MANIFEST_FILENAME
    data = dataset_path.read_bytes()
    manifest = json.loads(manifest_path.read_text())
    assert manifest["sha256"] == hashlib.sha256(data).hexdigest()
    assert manifest["build_seed"] == 7
    assert len(data.decode().splitlines()) == manifest["num_items"] == 12
    first = json.loads(data.decode().splitlines()[0])
    assert set(first) == {
        "id", "problem_id", "question", "solution", "y", "split",
        "prover_stance", "mutation", "mutation_description", "difficulty",
    }  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == [DATASET_FILENAME, MANIFEST_FILENAME]


def test_broken_reference_solution_stops_the_build():
    broken = _problem("fx-broken", ["print(int(input()) + 1)\n"], [("1", "2"), ("5", "7")])
    with pytest.raises(ProblemBankError, match=r"fx-broken: solution #0 does not pass"):
        build_dataset(BuildConfig(seed=1), problems=[broken])


def test_unknown_problem_id_is_rejected():
    with pytest.raises(ProblemBankError, match="fx-nope"):
        build_dataset(BuildConfig(problem_ids=["fx-nope"]), problems=BANK)

"""Tests of the shipped dataset file, its manifest and its loader."""

import hashlib
import json
import random
from collections import Counter, defaultdict

import pytest

from nip_core.scenarios.code_validation.dataset.build import DATA_DIR, MANIFEST_FILENAME
from nip_core.scenarios.code_validation.dataset.loader import (
    SHIPPED_DATASET_PATH,
    CodeValidationDataset,
    load_dataset,
)
from nip_core.scenarios.code_validation.dataset.mutations import MUTATION_OPERATORS
from nip_core.scenarios.code_validation.dataset.problems import load_problems, render_question
from nip_core.scenarios.code_validation.dataset.records import get_hash_parity
from nip_core.scenarios.code_validation.dataset.sandbox import check_solution


@pytest.fixture(scope="module")
def manifest():
    return json.loads((DATA_DIR / MANIFEST_FILENAME).read_text())


@pytest.fixture(scope="module")
def splits():
    return {split: CodeValidationDataset.from_name("nipflow-cv", split) for split in ("train", "test")}


@pytest.fixture(scope="module")
def everything(splits):
    return list(splits["train"]) + list(splits["test"])


@pytest.fixture(scope="module")
def bank():
    return {p.id: p for p in load_problems()}


def test_manifest_matches_the_file(manifest, splits):
    data = SHIPPED_DATASET_PATH.read_bytes()
    assert manifest["sha256"] == hashlib.sha256(data).hexdigest()
    assert manifest["num_items"] == len(data.decode("utf-8").splitlines())
    for split, ds in splits.items():
        labels = Counter(ds.labels.tolist())
        assert manifest["counts"][split] == {"correct": labels[1], "buggy": labels[0], "total": len(ds)}
        assert sorted(ds.problem_ids) == manifest["problems"][split]


def test_size_and_balance(manifest, splits):
    assert manifest["num_items"] >= 300
    for split, ds in splits.items():
        frac = ds.labels.mean()
        assert 0.45 <= frac <= 0.55, split
    assert 0.15 <= len(splits["test"]) / manifest["num_items"] <= 0.25


def test_split_is_by_problem_and_covers_the_bank(splits, bank):
    train, test = set(splits["train"].problem_ids), set(splits["test"].problem_ids)
    assert train.isdisjoint(test)
    assert train | test == set(bank)


def test_both_labels_for_most_problems_in_each_split(splits):
    for split, ds in splits.items():
        labels = defaultdict(set)
        for dp in ds:
            labels[dp.problem_id].add(dp.y)
        both = sum(1 for v in labels.values() if v == {0, 1})
        assert both / len(labels) >= 0.9, split


def test_rows_are_consistent_with_the_bank(everything, bank):
    assert sorted(dp.id for dp in everything) == list(range(len(everything)))
    operators = {op.name for op in MUTATION_OPERATORS}
    for dp in everything:
        problem = bank[dp.problem_id]
        assert dp.question == render_question(problem)
        assert dp.difficulty == problem.difficulty
        assert dp.prover_stance == get_hash_parity(dp.solution)
        if dp.y == 1:
            assert dp.solution in problem.solutions
            assert dp.mutation is None and dp.mutation_description is None
        else:
            assert dp.solution not in problem.solutions
            assert dp.mutation in operators and dp.mutation_description
    assert len({dp.solution for dp in everything}) == len(everything)


def test_max_size_and_path_loading(splits):
    small = CodeValidationDataset.from_name("nipflow-cv", "train", max_size=7)
    assert list(small) == list(splits["train"])[:7]
    by_path = load_dataset(SHIPPED_DATASET_PATH, "test")
    assert list(by_path) == list(splits["test"])


@pytest.mark.slow
def test_a_sample_of_labels_reverifies_by_execution(everything, bank):
    sample = random.Random(0).sample(everything, 40)
    for dp in sample:
        result = check_solution(dp.solution, bank[dp.problem_id].tests, timeout_s=10.0)
        if dp.y == 1:
            assert result.all_passed, (dp.id, result.outcomes)
        else:
            assert result.passed < result.total, (dp.id, result.outcomes)

"""Tests of the problem bank files and the question rendering."""

import pytest

from nip_core.scenarios.code_validation.dataset.problems import (
    ProblemBankError,
    load_problems,
    render_question,
)


@pytest.fixture(scope="module")
def bank():
    return load_problems()


def test_bank_size_and_shape(bank):
    assert len(bank) >= 60
    ids = [p.id for p in bank]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    for problem in bank:
        assert 6 <= len(problem.tests) <= 12, problem.id
        assert 1 <= len(problem.solutions) <= 3, problem.id
        assert len(set(problem.solutions)) == len(problem.solutions), problem.id
        assert all(case.input.endswith("\n") for case in problem.tests), problem.id
    assert sum(len(p.solutions) for p in bank) >= 150
    assert {p.difficulty for p in bank} == {"introductory", "interview"}


def test_render_question_has_apps_sections(bank):
    problem = next(p for p in bank if p.id == "cv-032")  # shows two examples
    text = render_question(problem)
    assert text.startswith(problem.statement.strip() + "\n\n-----Input-----\n\n")
    assert "\n\n-----Output-----\n\n" in text
    assert "-----Examples-----\nInput\n5\n1 3 5 7 9\n4\n0 1 6 10\n\nOutput\n0\n1\n3\n5\n\nInput\n3\n" in text
    single = render_question(bank[0])
    assert "-----Example-----\nInput\n" in single and "-----Examples-----" not in single


def test_malformed_problem_file_is_reported(tmp_path):
    (tmp_path / "a.yaml").write_text(
        "- id: x-1\n  title: T\n  difficulty: introductory\n  statement: S\n"
        "  input_format: I\n  output_format: O\n  solutions: ['print(1)']\n"
    )
    with pytest.raises(ProblemBankError, match=r"a\.yaml: problem x-1: invalid field\(s\) tests"):
        load_problems(tmp_path)
    (tmp_path / "a.yaml").write_text("- id: [unclosed\n")
    with pytest.raises(ProblemBankError, match=r"a\.yaml: invalid YAML"):
        load_problems(tmp_path)


def test_duplicate_ids_are_rejected(tmp_path):
    record = (
        "- id: x-1\n  title: T\n  difficulty: introductory\n  statement: S\n"
        "  input_format: I\n  output_format: O\n  solutions: ['print(1)']\n  tests: [['', '1']]\n"
    )
    (tmp_path / "a.yaml").write_text(record)
    (tmp_path / "b.yaml").write_text(record)
    with pytest.raises(ProblemBankError, match="duplicate problem id 'x-1'"):
        load_problems(tmp_path)

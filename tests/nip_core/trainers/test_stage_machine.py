"""The pure-text stage machine: ``next_stage`` edge by edge, and the documented diagram."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from nip_core.parameters import HyperParameters
from nip_core.trainers.pure_text_base import PureTextState
from nip_core.trainers.stage_machine import STAGE_ORDER, Position, Stage, StageOrderError, next_stage, stage_position

DOC = Path(__file__).resolve().parents[3] / "docs" / "architecture.md"


def params(n: int, rerun: bool) -> HyperParameters:
    base_run = {"base_run_type": "rerun_tests", "run_id": "base"} if rerun else {}
    return HyperParameters(scenario="code_validation", trainer="pure_text_ei", dataset="test",
                           rl={"num_iterations": n}, base_run=base_run)


def state(iteration: int, stage: str, version: int = 0) -> PureTextState:
    return PureTextState(iteration=iteration, train_loop_stage=stage, base_run_state_artifact_version=version)


@pytest.mark.parametrize("stage, it, n, rerun, version, expected", [
    ("sample_rollouts", 1, 3, False, 0, (1, "log_stats")),
    ("sample_rollouts", 1, 3, True, 1, (1, "test_during_training")),  # base run has iteration 1
    ("sample_rollouts", 2, 3, True, 1, (3, "test")),  # base run stopped after iteration 1
    ("log_stats", 0, 3, False, 0, (0, "test_during_training")),
    ("test_during_training", 0, 3, False, 0, (0, "create_fine_tune_jobs")),
    ("test_during_training", 1, 3, False, 0, (1, "create_fine_tune_jobs")),
    ("test_during_training", 2, 3, False, 0, (3, "test")),  # no fine-tuning after the last iteration
    ("test_during_training", 0, 1, False, 0, (1, "test")),
    ("test_during_training", 0, 3, True, 0, (1, "sample_rollouts")),  # rerun: no fine-tuning at all
    ("test_during_training", 2, 3, True, 2, (3, "test")),
    ("create_fine_tune_jobs", 1, 3, False, 0, (1, "await_fine_tune_jobs")),
    ("await_fine_tune_jobs", 1, 3, False, 0, (2, "sample_rollouts")),
    ("test", 3, 3, False, 0, (3, "done")),
    ("test", 3, 3, True, 1, (3, "done")),
])
def test_next_stage_edges(stage, it, n, rerun, version, expected):
    got = next_stage(state(it, stage, version), params(n, rerun))
    assert got == expected and isinstance(got, Position) and isinstance(got.stage, Stage)


def test_done_has_no_successor():
    with pytest.raises(StageOrderError, match="done"):
        next_stage(state(2, "done"), params(2, False))


def test_stage_values_are_the_stored_strings_and_an_old_state_loads():
    assert [s.value for s in STAGE_ORDER] == ["sample_rollouts", "log_stats", "test_during_training",
                                              "create_fine_tune_jobs", "await_fine_tune_jobs", "test", "done"]
    old = PureTextState.model_validate_json('{"iteration": 2, "train_loop_stage": "test", "tokens_used": 5}')
    assert old.train_loop_stage is Stage.TEST and old.base_run_state_artifact_version == 0
    assert '"train_loop_stage":"test"' in old.model_dump_json()
    with pytest.raises(ValueError, match="train_loop_stage"):
        PureTextState.model_validate({"train_loop_stage": "testing"})


def reachable_edges() -> set[tuple[str, str]]:
    """Every (stage, next stage) reachable from the start of a run, walking ``next_stage``
    over runs of 1-3 iterations in both modes; in rerun mode each ``sample_rollouts``
    branches on whether the base run has the iteration (the stage function then sets
    ``base_run_state_artifact_version`` to it)."""
    edges = set()
    for n, rerun in itertools.product((1, 2, 3), (False, True)):
        hp = params(n, rerun)
        todo, seen = [(0, Stage.SAMPLE_ROLLOUTS, 0)], set()
        while todo:
            i, stage, version = todo.pop()
            if (i, stage, version) in seen or stage is Stage.DONE:
                continue
            seen.add((i, stage, version))
            outcomes = {version, i} if rerun and stage is Stage.SAMPLE_ROLLOUTS else {version}
            for v in outcomes:
                nxt = next_stage(state(i, stage, v), hp)
                assert stage_position(*nxt) > stage_position(i, stage)  # always forward
                assert nxt.iteration <= n and (nxt.stage is Stage.TEST) == (nxt.iteration == n) or \
                    nxt.stage is Stage.DONE
                edges.add((stage.value, nxt.stage.value))
                todo.append((nxt.iteration, nxt.stage, v))
        # the end is reached after the last iteration and, in rerun mode, after stopping early
        assert {(i, s) for i, s, _ in seen if s is Stage.TEST} == {(n, Stage.TEST)}
        if rerun:
            assert {v for i, s, v in seen if s is Stage.TEST} == set(range(n))
    return edges


def documented_edges() -> set[tuple[str, str]]:
    text = DOC.read_text()
    section = text[text.index("## The pure-text stage machine"):]
    block = re.search(r"```mermaid\n(.*?)```", section, re.S).group(1)
    return {(a, b) for a, b in re.findall(r"^\s*(\w+)\s*-->(?:\|[^|]*\|)?\s*(\w+)\s*$", block, re.M)}


def test_the_documented_diagram_is_the_transition_function():
    documented = documented_edges()
    assert len(documented) == 10
    assert documented == reachable_edges()


def test_the_three_edges_outside_the_plain_loop():
    edges = reachable_edges()
    assert ("sample_rollouts", "test_during_training") in edges  # rerun skips log_stats
    assert ("test_during_training", "test") in edges  # the last iteration
    assert ("sample_rollouts", "test") in edges  # a rerun past its base run
    assert ("log_stats", "create_fine_tune_jobs") not in edges

"""Rerun-tests mode of the TorchRL trainers (issue #29 item 2; docs/behaviour.md#b37).

``base_run.base_run_type = "rerun_tests"`` tests the base run's newest checkpoint with the
rerun's own test settings and trains nothing: nip's
``load_and_set_state_from_checkpoint(from_base_run=True)`` and
``_load_state_dict_from_base_run_checkpoint``.
"""

from __future__ import annotations

import pytest
import torch

from nip_core.errors import CheckpointNotFoundError
from nip_core.runs import RunStore
from nip_core.trainers.build import build_trainer
from nip_core.trainers.checkpoint_files import load_run_checkpoint
from tests.nip_core.trainers.gi_helpers import settings_for, tiny_params

RERUN = {"base_run_type": "rerun_tests", "run_id": "base"}


def _run(tmp_path, run_id, **overrides):
    trainer = build_trainer(tiny_params(**overrides), settings_for(tmp_path, run_id=run_id))
    try:
        trainer.train()
    finally:
        trainer.close()
    return trainer


def _test_rows(run):
    return [r for r in run.read_metrics() if r["kind"] == "test"]


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    """A base run trained for 2 iterations, then tested with 2 test batches."""
    path = tmp_path_factory.mktemp("rerun")
    _run(path, "base", rl={"num_iterations": 2, "num_test_iterations": 2})
    return path


def test_a_rerun_tests_the_base_runs_checkpoint_without_training(base_dir):
    base = RunStore(str(base_dir)).open_run("base")
    rerun = _run(base_dir, "again", base_run=RERUN, rl={"num_test_iterations": 2})
    assert rerun.hyper_params.rl.num_iterations == 2  # the base run's parameters
    assert [r["kind"] for r in rerun.run.read_metrics()] == ["test"]  # nothing trained
    assert rerun.run.list_checkpoints() == ["iter_000002"]
    mine, _ = load_run_checkpoint(rerun.run, "iter_000002")
    theirs, _ = load_run_checkpoint(base, "iter_000002")
    assert mine["agents"].keys() == theirs["agents"].keys()
    assert all(torch.equal(mine["agents"][k], theirs["agents"][k]) for k in theirs["agents"])
    # the same checkpoint and the same test settings: exactly the base run's test statistics
    (again,), (original,) = _test_rows(rerun.run), _test_rows(base)
    assert again["iteration"] == original["iteration"] == 2
    assert {k: v for k, v in again.items() if k != "time"} == {k: v for k, v in original.items() if k != "time"}


def test_the_reruns_own_test_settings_are_used_and_a_resume_reuses_its_copy(base_dir):
    rerun = _run(base_dir, "longer", base_run=RERUN, rl={"num_test_iterations": 4})
    (row,) = _test_rows(rerun.run)
    (original,) = _test_rows(RunStore(str(base_dir)).open_run("base"))
    assert row["test_num_episodes"] > original["test_num_episodes"]  # 4 test batches, not 2
    resumed = build_trainer(tiny_params(base_run=RERUN, rl={"num_test_iterations": 4}),
                            settings_for(base_dir, run_id="longer"))
    resumed.hyper_params.base_run.__dict__["run_id"] = "gone"  # the base run is not read again
    resumed.run_iterations(0, 2)
    assert resumed._memory_iteration == 2 and resumed.run.list_checkpoints() == ["iter_000002"]
    resumed.close()


def test_nips_loading_hooks(base_dir):
    trainer = build_trainer(tiny_params(base_run={"base_run_type": "parameters", "run_id": "base"}),
                            settings_for(base_dir, run_id="hooks"))
    try:
        with pytest.raises(CheckpointNotFoundError, match="checkpoint of this run"):
            trainer._load_state_dict_from_active_run_checkpoint()
        assert trainer._load_state_dict_from_base_run_checkpoint()["iteration"] == 2
        assert trainer._load_state_dict_from_base_run_checkpoint(version=2)["iteration"] == 2
        with pytest.raises(ValueError, match="version: only 'latest'"):
            trainer.load_and_set_state_from_checkpoint(version=1)
        trainer.load_and_set_state_from_checkpoint(from_base_run=True)
        assert trainer._memory_iteration == 2
    finally:
        trainer.close()

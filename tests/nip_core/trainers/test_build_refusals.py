"""build_trainer refuses what a trainer would silently ignore.

Before: ``base_run.base_run_type="rerun_tests"`` with a TensorDict trainer was accepted and
the run trained from scratch (nip's rerun-tests mode only exists for the pure-text trainers).
"""

from __future__ import annotations

import pytest

from flows.cli import main
from nip_core.parameters.base import ParameterError
from nip_core.runs import RunStore
from nip_core.trainers.build import build_trainer
from tests.nip_core.trainers.gi_helpers import settings_for, tiny_params


@pytest.mark.parametrize("trainer", ["vanilla_ppo", "spg", "reinforce", "solo_agent"])
def test_rerun_tests_with_a_tensordict_trainer_is_refused_naming_the_field(tmp_path, trainer):
    RunStore(str(tmp_path)).open_run("base", tiny_params(trainer=trainer))
    hp = tiny_params(trainer=trainer, base_run={"base_run_type": "rerun_tests", "run_id": "base"})
    with pytest.raises(ParameterError, match=r"base_run\.base_run_type: 'rerun_tests' is implemented for the "
                                             r"pure-text trainers only") as info:
        build_trainer(hp, settings_for(tmp_path, run_id="rerun"))
    assert "nipflow evaluate" in str(info.value)
    assert not (tmp_path / "rerun").exists()  # nothing was opened or written


def test_the_cli_says_it_in_one_line(tmp_path, capsys):
    RunStore(str(tmp_path)).open_run("base", tiny_params())
    status = main(["run", "graph_isomorphism", "vanilla_ppo", "--direct", "--no-wandb", "--progress", "off",
                   "--dataset", "test", "--runs-dir", str(tmp_path), "--run-id", "rerun",
                   "--set", "base_run.base_run_type=rerun_tests", "--set", "base_run.run_id=base"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2
    assert len(err) == 1 and "base_run.base_run_type: 'rerun_tests'" in err[0], err

"""build_trainer refuses what a trainer would silently ignore.

Before: ``base_run.base_run_type="rerun_tests"`` with a TensorDict trainer was accepted and
the run trained from scratch. The TorchRL trainers now test the base run's checkpoint
(``test_rerun_tests_tensordict.py``); ``solo_agent``, which has no such loop, is refused, and
so is a base run without a checkpoint.
"""

from __future__ import annotations

import pytest

from flows.cli import main
from nip_core.parameters.base import ParameterError
from nip_core.runs import RunStore
from nip_core.trainers.build import build_trainer
from tests.nip_core.trainers.gi_helpers import settings_for, tiny_params

RERUN = {"base_run_type": "rerun_tests", "run_id": "base"}


def test_rerun_tests_with_solo_agent_is_refused_naming_the_field(tmp_path):
    RunStore(str(tmp_path)).open_run("base", tiny_params(trainer="solo_agent"))
    hp = tiny_params(trainer="solo_agent", base_run=RERUN)
    with pytest.raises(ParameterError, match=r"base_run\.base_run_type: 'rerun_tests' is implemented for the "
                                             r"pure-text trainers and the TorchRL trainers .*not for 'solo_agent'"
                       ) as info:
        build_trainer(hp, settings_for(tmp_path, run_id="rerun"))
    assert "nipflow evaluate" in str(info.value)
    assert not (tmp_path / "rerun").exists()  # nothing was opened or written


@pytest.mark.parametrize("trainer", ["vanilla_ppo", "spg", "reinforce"])
def test_rerun_tests_of_a_base_run_without_a_checkpoint_is_refused_naming_the_run(tmp_path, trainer):
    RunStore(str(tmp_path)).open_run("base", tiny_params(trainer=trainer))
    with pytest.raises(ParameterError, match=r"base_run\.run_id: run 'base' has no checkpoint to test again"):
        build_trainer(tiny_params(trainer=trainer, base_run=RERUN), settings_for(tmp_path, run_id="rerun"))
    assert not (tmp_path / "rerun").exists()


def test_the_cli_says_it_in_one_line(tmp_path, capsys):
    RunStore(str(tmp_path)).open_run("base", tiny_params(trainer="solo_agent"))
    status = main(["run", "graph_isomorphism", "solo_agent", "--direct", "--no-wandb", "--progress", "off",
                   "--dataset", "test", "--runs-dir", str(tmp_path), "--run-id", "rerun",
                   "--set", "base_run.base_run_type=rerun_tests", "--set", "base_run.run_id=base"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2
    assert len(err) == 1 and "base_run.base_run_type: 'rerun_tests'" in err[0], err

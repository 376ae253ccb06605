"""The ``nipflow`` command: bad input exits 2 with one clear line, never a traceback."""

import json
import subprocess
import sys

import pytest

from flows.cli import main


def run_cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], capture_output=True, text=True,
                          cwd=cwd, stdin=subprocess.DEVNULL, timeout=120)


def test_params_validate_names_deep_dotted_path(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"scenario": "graph_isomorphism", "trainer": "vanilla_ppo", "dataset": "t",
                                "agents": {"verifier": {"body_lr_factor": {"critic": "high"}}}}))
    out = run_cli("params", "validate", str(path))
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr
    assert "agents.verifier.body_lr_factor.critic" in lines[0] and str(path) in lines[0]


def test_params_validate_ok_and_show(tmp_path, capsys):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"scenario": "graph_isomorphism", "trainer": "vanilla_ppo", "dataset": "t"}))
    assert main(["params", "validate", str(path)]) == 0
    assert "valid" in capsys.readouterr().out
    assert main(["params", "show", "--scenario", "code_validation", "--trainer", "pure_text_ei",
                 "--set", "rl.num_iterations=3"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["rl"]["num_iterations"] == 3 and shown["dataset"] == "nipflow-cv"


def test_bad_override_and_missing_file(tmp_path, capsys):
    assert main(["params", "show", "--scenario", "graph_isomorphism", "--trainer", "vanilla_ppo",
                 "--set", "rl.gamma=2"]) == 2
    assert "rl.gamma" in capsys.readouterr().err
    assert main(["params", "validate", str(tmp_path / "nope.json")]) == 2
    assert "nope.json" in capsys.readouterr().err


def test_run_twice_with_different_params_is_refused(tmp_path, capsys, monkeypatch):
    # The first run only needs to create the run; the refusal happens before training.
    from nip_core.parameters import HyperParameters
    from nip_core.runs import RunStore

    store = RunStore(str(tmp_path))
    first = HyperParameters.from_dict({"scenario": "graph_isomorphism", "trainer": "vanilla_ppo",
                                       "dataset": "small", "rl": {"num_iterations": 2}})
    store.open_run("X", first)
    code = main(["run", "graph_isomorphism", "vanilla_ppo", "--run-id", "X", "--runs-dir", str(tmp_path),
                 "--direct", "--no-wandb", "--set", "rl.num_iterations=5", "--set", "rl.lr=0.1"])
    err = capsys.readouterr().err
    assert code == 2
    assert "rl.num_iterations" in err and "rl.lr" in err and "Traceback" not in err
    assert store.load_params("X").rl.num_iterations == 2


def test_bad_run_id_and_unknown_run(tmp_path, capsys):
    assert main(["run", "graph_isomorphism", "vanilla_ppo", "--run-id", "../evil", "--direct",
                 "--runs-dir", str(tmp_path)]) == 2
    assert "invalid run_id" in capsys.readouterr().err
    assert main(["resume", "ghost", "--runs-dir", str(tmp_path), "--direct"]) == 2
    assert "ghost" in capsys.readouterr().err
    assert main(["status", "ghost", "--runs-dir", str(tmp_path)]) == 2


def test_status_of_a_fresh_run(tmp_path, capsys):
    from nip_core.parameters import HyperParameters
    from nip_core.runs import RunStore

    run = RunStore(str(tmp_path)).open_run("S1", HyperParameters.from_dict(
        {"scenario": "graph_isomorphism", "trainer": "vanilla_ppo", "dataset": "t", "rl": {"num_iterations": 4}}))
    run.append_metrics(0, {"mean_accuracy": 0.75})
    assert main(["status", "S1", "--runs-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "S1" in out and "0/4" in out and "mean_accuracy=0.75" in out


@pytest.mark.parametrize("argv", [["frobnicate"], ["run"], ["run", "chess", "vanilla_ppo"]])
def test_usage_errors_exit_2(argv):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2

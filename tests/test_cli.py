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


# -- nipflow evaluate --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def evaluated_run(tmp_path_factory):
    """A tiny GI run (graphs of at most 6 nodes) and original-format files, one of 7-9-node graphs."""
    import torch

    from tests.nip_core.evaluation_helpers import train_tiny_run, write_files

    root = tmp_path_factory.mktemp("evaluate")
    files = write_files(root / "files")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train_tiny_run(root / "runs", files, run_id="gi")
    finally:
        torch.set_num_threads(threads)
    return root / "runs", files


def test_evaluate_prints_a_table_then_the_accuracy_line(evaluated_run, capsys):
    import re

    from nip_core.evaluation import evaluate_run
    from tests.nip_core.evaluation_helpers import NUM_BIG_PAIRS

    runs_dir, files = evaluated_run
    argv = ["evaluate", "gi", "--dataset-file", str(files["big"]), "--runs-dir", str(runs_dir)]
    assert main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    match = re.fullmatch(r"test_accuracy=([0-9.e-]+) n=(\d+)", lines[-1])
    assert match and int(match.group(2)) == NUM_BIG_PAIRS
    expected = evaluate_run("gi", files["big"], runs_dir=str(runs_dir))
    assert float(match.group(1)) == expected["test_accuracy"]
    assert any(line.split()[:1] == ["test_num_episodes"] for line in lines[:-1])
    assert main([*argv, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)  # only JSON on stdout
    assert shown["n"] == NUM_BIG_PAIRS and shown["test_accuracy"] == expected["test_accuracy"]
    assert shown["stats"] == expected["stats"]


def test_evaluate_errors_exit_2_naming_the_run_or_file(evaluated_run, tmp_path, capsys):
    import torch

    from nip_core.scenarios.graph_isomorphism.raw_data import load_raw

    runs_dir, files = evaluated_run
    out = run_cli("evaluate", "nope", "--dataset-file", str(files["big"]), "--runs-dir", str(runs_dir))
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and out.stdout == "" and len(lines) == 1 and "run 'nope' not found" in lines[0]
    missing = tmp_path / "missing.pt"
    assert main(["evaluate", "gi", "--dataset-file", str(missing), "--runs-dir", str(runs_dir)]) == 2
    assert f"{missing}: raw data file does not exist" in capsys.readouterr().err
    data = load_raw(files["big"])
    del data["wl_scores"]
    torch.save(data, tmp_path / "bad.pt")
    assert main(["evaluate", "gi", "--dataset-file", str(tmp_path / "bad.pt"), "--runs-dir", str(runs_dir)]) == 2
    err = capsys.readouterr().err
    assert "bad.pt: missing keys ['wl_scores']" in err and "Traceback" not in err


def test_evaluate_transcripts_draw_one_picture_per_pair(evaluated_run, tmp_path, capsys):
    runs_dir, files = evaluated_run
    argv = ["evaluate", "gi", "--dataset-file", str(files["big"]), "--runs-dir", str(runs_dir)]
    assert main([*argv, "--pictures", str(tmp_path / "pics")]) == 2
    assert "--pictures: draws transcripts; give --transcripts N too" in capsys.readouterr().err
    assert main([*argv, "--transcripts", "-1"]) == 2
    assert "--transcripts -1: a number of pairs per class" in capsys.readouterr().err
    assert main([*argv, "--transcripts", "1", "--pictures", str(tmp_path / "pics"), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    pairs = [t["pair"] for t in shown["transcripts"]]
    classes = {(t["y"], t["wl_score"]) for t in shown["transcripts"]}  # one pair of each
    assert len(pairs) == len(classes) >= 2 and shown["transcripts"][0]["y"] == 1
    assert sorted(p.name for p in (tmp_path / "pics").iterdir()) == sorted(f"pair_{p}.png" for p in pairs)

"""Every ``nipflow`` sub-command, given a bad value for each option, exits 2 with one line.

The line is on stderr and names the option (or the field, file or run at fault); there is
no traceback, nothing on stdout, nothing is read from stdin, and nothing is created or
changed: the whole directory the cases run in (an existing run store among it) is the same
byte for byte afterwards. The cases run in-process (``flows.cli.main``); a few run as real
processes for the exit status and the bytes on stderr.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flows.cli import main

REPO = Path(__file__).resolve().parents[1]
GI = ["run", "graph_isomorphism", "vanilla_ppo", "--direct", "--no-wandb", "--progress", "off"]
SWEEP = ["sweep", "{w}/sweep.json", "--scenario", "graph_isomorphism", "--trainer", "vanilla_ppo", "--sweep-id", "s"]
UNDER_A_FILE = "{w}/afile/sub"
R1 = {"scenario": "graph_isomorphism", "trainer": "vanilla_ppo", "dataset": "test", "rl": {"num_iterations": 2}}

# (argv, what the one line must contain); {w} is the directory the cases run in, whose run
# store ({w}/store, $NIPFLOW_RUNS_DIR) holds the run r1.
CASES = [
    # nipflow itself
    ([], "command"),
    (["frobnicate"], "frobnicate"),
    (["-v=1", "status", "r1"], "--verbose"),
    # run: scenario, trainer, protocol, dataset, files, overrides, run id, settings flags
    (["run", "chess", "vanilla_ppo"], "chess"),
    (["run", "graph_isomorphism"], "trainer"),
    ([*GI[:2], "nosuch", *GI[3:]], "nosuch"),
    ([*GI, "--protocol", "nosuch"], "protocol"),
    ([*GI, "--dataset", "nosuch"], "--dataset"),
    (["run", "code_validation", "pure_text_ei", "--direct", "--dataset", "nosuch"], "--dataset"),
    ([*GI, "--params", "{w}/missing.json"], "{w}/missing.json"),
    ([*GI, "--params", "{w}/bad.json"], "{w}/bad.json"),
    ([*GI, "--params", "{w}"], "{w}"),
    ([*GI, "--set", "noequals"], "noequals"),
    ([*GI, "--set", "rl.num_iterations=abc"], "rl.num_iterations"),
    ([*GI, "--set", "rl.gamma=2"], "rl.gamma"),
    ([*GI, "--set", "nosuch.key=1"], "nosuch"),
    ([*GI, "--run-id", "../x"], "run_id"),
    ([*GI, "--run-id", ""], "run_id"),
    ([*GI, "--on-params-mismatch", "x"], "--on-params-mismatch"),
    ([*GI, "--runs-dir", UNDER_A_FILE], "--runs-dir"),
    ([*GI, "--runs-dir", "/proc/x"], "--runs-dir"),
    ([*GI, "--runs-dir", "s3:/x"], "--runs-dir"),
    ([*GI, "--runs-dir", "foo://bar"], "--runs-dir"),
    ([*GI, "--runs-dir", ""], "--runs-dir"),
    ([*GI, "--device", "gpu"], "--device"),
    ([*GI, "--device", "cuda:x"], "--device"),
    ([*GI, "--device", "cuda:99"], "--device"),
    ([*GI, "--device", ""], "--device"),
    ([*GI, "--progress", "x"], "--progress"),
    ([*GI, "--checkpoint-every", "-1"], "--checkpoint-every"),
    ([*GI, "--checkpoint-every", "abc"], "--checkpoint-every"),
    ([*GI, "--no-wandb=1"], "--no-wandb"),
    ([*GI, "--json=yes"], "--json"),
    ([*GI, "--bogus"], "--bogus"),
    ([*GI, "--run-id", "r1", "--device", "gpu"], "--device"),
    # through Prefect, refused before it starts: r1 has other parameters
    (["run", "graph_isomorphism", "vanilla_ppo", "--dataset", "test", "--run-id", "r1", "--no-wandb",
      "--set", "rl.num_iterations=7"], "rl.num_iterations"),
    # resume
    (["resume", "ghost", "--direct"], "ghost"),
    (["resume", "../x"], "run_id"),
    (["resume", "r1", "--direct", "--device", "gpu"], "--device"),
    (["resume", "r1", "--device", "cuda:99"], "--device"),
    (["resume", "r1", "--runs-dir", "foo://bar"], "--runs-dir"),
    (["resume", "r1", "--runs-dir", UNDER_A_FILE], "--runs-dir"),
    (["resume", "r1", "--checkpoint-every", "-5"], "--checkpoint-every"),
    (["resume", "r1", "--progress", "x"], "--progress"),
    (["resume", "r1", "--from-wandb", "a/b"], "--from-wandb"),
    (["resume", "r1", "--from-wandb", "entity/project/id"], "--from-wandb"),  # r1 exists: nothing to restore
    (["resume", "ghost", "--wandb-dir", "{w}/missing"], "--wandb-dir"),
    (["resume", "r1", "--wandb-dir", "{w}", "--from-wandb", "a/b/c"], "--from-wandb"),
    # status
    (["status"], "run_id"),
    (["status", "ghost"], "ghost"),
    (["status", "../x"], "run_id"),
    (["status", "r1", "--runs-dir", UNDER_A_FILE], "--runs-dir"),
    (["status", "r1", "--runs-dir", "foo://bar"], "--runs-dir"),
    (["status", "r1", "--json=1"], "--json"),
    # evaluate
    (["evaluate", "r1"], "--dataset-file"),
    (["evaluate", "r1", "--dataset-file", "{w}/missing.pt"], "--dataset-file"),
    (["evaluate", "r1", "--dataset-file", "{w}"], "--dataset-file"),
    (["evaluate", "r1", "--dataset-file", "{w}/p.json", "--mode", "x"], "--mode"),
    (["evaluate", "r1", "--dataset-file", "{w}/p.json", "--device", "gpu"], "--device"),
    (["evaluate", "r1", "--dataset-file", "{w}/p.json", "--runs-dir", "foo://bar"], "--runs-dir"),
    (["evaluate", "ghost", "--dataset-file", "{w}/p.json"], "ghost"),
    # params show / validate
    (["params"], "params_command"),
    (["params", "show"], "--scenario"),
    (["params", "show", "--scenario", "nosuch", "--trainer", "vanilla_ppo"], "scenario"),
    (["params", "show", "--scenario", "graph_isomorphism", "--trainer", "nosuch"], "nosuch"),
    (["params", "show", "--scenario", "graph_isomorphism", "--trainer", "vanilla_ppo", "--protocol", "x"], "protocol"),
    (["params", "show", "--scenario", "graph_isomorphism", "--trainer", "vanilla_ppo", "--set", "rl.lr=x"], "rl.lr"),
    (["params", "show", "{w}/missing.json"], "{w}/missing.json"),
    (["params", "show", "{w}/bad.json"], "{w}/bad.json"),
    (["params", "show", "{w}/p.json", "--describe=1"], "--describe"),
    (["params", "validate"], "file"),
    (["params", "validate", "{w}/missing.json"], "{w}/missing.json"),
    (["params", "validate", "{w}/bad.json"], "{w}/bad.json"),
    (["params", "validate", "{w}/p.json", "--set", "x"], "x"),
    # sweep
    (["sweep", "{w}/sweep.json", "--scenario", "graph_isomorphism"], "--sweep-id"),
    ([*SWEEP[:1], "{w}/missing.json", *SWEEP[2:]], "{w}/missing.json"),
    ([*SWEEP[:1], "{w}/bad.json", *SWEEP[2:]], "{w}/bad.json"),
    (["sweep", "{w}/sweep.json", "--sweep-id", "s"], "--params"),
    ([*SWEEP[:1], "{w}/sweep-variant.json", *SWEEP[2:]], "rl.gamma"),  # refused before Prefect starts
    ([*SWEEP[:1], "{w}/sweep-grid.json", *SWEEP[2:]], "nosuch"),
    ([*SWEEP[:1], "{w}/sweep-clash.json", *SWEEP[2:]], "seed"),
    ([*SWEEP, "--params", "{w}/missing.json"], "{w}/missing.json"),
    (["sweep", "{w}/sweep.json", "--scenario", "nosuch", "--sweep-id", "s"], "--scenario"),
    ([*SWEEP[:4], "--trainer", "nosuch", "--sweep-id", "s"], "nosuch"),
    ([*SWEEP, "--set", "rl.gamma=7"], "rl.gamma"),
    ([*SWEEP[:-1], "../x"], "run_id"),
    ([*SWEEP, "--out", "{w}/cmp.txt"], ".md"),
    ([*SWEEP, "--out", "{w}/afile/cmp.md"], "--out"),
    ([*SWEEP, "--runs-dir", "foo://bar"], "--runs-dir"),
    ([*SWEEP, "--runs-dir", UNDER_A_FILE], "--runs-dir"),
    ([*SWEEP, "--device", "gpu"], "--device"),
    ([*SWEEP, "--checkpoint-every", "-1"], "--checkpoint-every"),
    ([*SWEEP, "--progress", "x"], "--progress"),
    ([*SWEEP, "--direct"], "--direct"),
    # report
    (["report"], "run_id"),
    (["report", "ghost"], "ghost"),
    (["report", "../x"], "run_id"),
    (["report", "r1", "--out", UNDER_A_FILE], "--out"),
    (["report", "r1", "--runs-dir", "foo://bar"], "--runs-dir"),
    (["report", "r1", "--runs-dir", UNDER_A_FILE], "--runs-dir"),
    # api-server
    (["api-server", "--port", "70000"], "--port"),
    (["api-server", "--port", "-1"], "--port"),
    (["api-server", "--port", "abc"], "--port"),
    (["api-server", "--host", "999.1.1.1"], "--host"),
    (["api-server", "--host", "0.0.0.0"], "--host 0.0.0.0: without a key"),  # no --api-key, no env key
    (["api-server", "--data-dir", UNDER_A_FILE], "--data-dir"),
    (["api-server", "--data-dir", "/proc/x"], "--data-dir"),
    (["api-server", "--job-time-scale", "abc"], "--job-time-scale"),
    (["api-server", "--job-time-scale", "-1"], "--job-time-scale"),
    (["api-server", "--api-key"], "--api-key"),
    (["api-server", "--latency-ms", "-1"], "--latency-ms"),
    (["api-server", "--faults", "{bad"], "--faults"),
    (["api-server", "--faults", "@{w}/missing.json"], "--faults"),
    (["api-server", "--faults", '{"nosuch": 1}'], "--faults"),
    (["api-server", "--job-workers", "0"], "--job-workers"),
    (["api-server", "--log-level", "x"], "--log-level"),
    (["api-server", "--engine", "x"], "--engine"),
    (["api-server", "--base-model", "x"], "--base-model"),
    (["api-server", "--device", "gpu"], "--device"),
    (["api-server", "--engine", "transformers", "--device", "gpu"], "--device"),
    (["api-server", "--full-fine-tune"], "--full-fine-tune"),
    (["api-server", "--allow-download"], "--allow-download"),
    (["api-server", "--engine", "transformers", "--batch-window-ms", "5000"], "--batch-window-ms"),
    (["api-server", "--engine", "transformers", "--max-batch-size", "0"], "--max-batch-size"),
    (["api-server", "--engine", "transformers", "--prefix-cache-mb", "-1"], "--prefix-cache-mb"),
    (["api-server", "--engine", "vllm", "--prefix-cache-mb", "64"], "--prefix-cache-mb"),
    (["api-server", "--engine", "vllm", "--tensor-parallel-size", "0"], "--tensor-parallel-size"),
    (["api-server", "--engine", "vllm", "--gpu-memory-utilization", "2"], "--gpu-memory-utilization"),
    (["api-server", "--bogus"], "--bogus"),
    # api-server stop
    (["api-server", "stop", "--port", "70000"], "--port"),
    (["api-server", "stop", "--port", "abc"], "--port"),
    (["api-server", "stop", "--timeout", "-1"], "--timeout"),
    (["api-server", "stop", "--timeout", "abc"], "--timeout"),
    (["api-server", "stop", "--data-dir", UNDER_A_FILE], "--data-dir"),
    (["api-server", "stop", "--host", "999.1.1.1", "--port", "5"], "--host"),
    (["api-server", "stop", "--host", "localhost"], "--host"),
    (["api-server", "stop", "--data-dir", "{w}", "--port", "5"], "--port"),
    # ui
    (["ui", "--port", "-1"], "--port"),
    (["ui", "--port", "70000"], "--port"),
    (["ui", "--port", "abc"], "--port"),
    (["ui", "--host", "999.1.1.1"], "--host"),
    (["ui", "--runs-dir", "foo://bar"], "--runs-dir"),
    (["ui", "--runs-dir", "s3:/x"], "--runs-dir"),
    (["ui", "--runs-dir", UNDER_A_FILE], "--runs-dir"),
    (["ui"], "Prefect history"),  # the run store has none
    # worker (prefect worker start's options)
    (["worker"], "--pool"),
    (["worker", "--pool"], "--pool"),
    (["worker", "--pool", "p", "--limit", "abc"], "--limit"),
    (["worker", "--pool", "p", "--limit", "0"], "--limit"),
    (["worker", "--pool", "p", "--prefetch-seconds", "-1"], "--prefetch-seconds"),
    (["worker", "--pool", "p", "--install-policy", "x"], "--install-policy"),
    (["worker", "--pool", "p", "--base-job-template", "{w}/missing.json"], "--base-job-template"),
    (["worker", "--pool", "p", "--base-job-template", "{w}/bad.json"], "--base-job-template"),
    (["worker", "--pool", "p", "--bogus"], "--bogus"),
    (["worker", "--pool", "p", "extra"], "extra"),
    # prefect setup / server
    (["prefect"], "prefect_command"),
    (["prefect", "setup", "--gpus", "-1"], "--gpus"),
    (["prefect", "setup", "--gpus", "abc"], "--gpus"),
    (["prefect", "server", "--port", "70000"], "--port"),
    (["prefect", "server", "--port", "abc"], "--port"),
    (["prefect", "server", "--pg-port", "0"], "--pg-port"),
    (["prefect", "server", "--host", "999.1.1.1"], "--host"),
    (["prefect", "server", "--host", "0.0.0.0"], "--host 0.0.0.0: the Prefect API"),  # no API auth string
    (["prefect", "server", "--data-dir", UNDER_A_FILE], "--data-dir"),
    (["prefect", "server", "--data-dir", "/proc/x"], "--data-dir"),
    (["prefect", "server", "--database-url", "foo://bar"], "--database-url"),
    (["prefect", "server", "--database-url", "nourl"], "--database-url"),
    (["prefect", "server", "--database-url", "postgresql://h/db", "--pg-port", "5432"], "--pg-port"),
]
# (environment, argv, what the line must contain): a bad default from the environment
ENV_CASES = [
    ({"NIPFLOW_RUNS_DIR": "foo://bar"}, ["status", "r1"], "NIPFLOW_RUNS_DIR"),
    ({"NIPFLOW_RUNS_DIR": "{w}/afile/runs"}, [*GI], "NIPFLOW_RUNS_DIR"),
]


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """A directory with a regular file, parameter and sweep files, and a run store holding r1."""
    from nip_core.parameters import HyperParameters
    from nip_core.runs import RunStore

    root = tmp_path_factory.mktemp("bad-input")
    (root / "afile").write_text("a regular file\n")
    (root / "p.json").write_text(json.dumps(R1))
    (root / "bad.json").write_text("{not json")
    (root / "sweep.json").write_text(json.dumps({"variants": {"a": {"interaction_protocol": "nip"}}}))
    (root / "sweep-variant.json").write_text(json.dumps({"variants": {"hot": {"rl.gamma": 7}}}))
    (root / "sweep-grid.json").write_text(json.dumps({"grid": {"dataset": ["test", "nosuch"]}}))
    (root / "sweep-clash.json").write_text(json.dumps({"variants": {"a": {"seed": 1}}, "grid": {"seed": [2]}}))
    run = RunStore(str(root / "store")).open_run("r1", HyperParameters.from_dict(R1))
    run.append_metrics(0, {"mean_accuracy": 0.5})
    return root


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every file (its bytes) and directory (None) under ``root``."""
    found: dict[str, bytes | None] = {}
    for path in sorted(root.rglob("*")):
        found[str(path.relative_to(root))] = None if path.is_dir() else path.read_bytes()
    return found


class NoStdin:
    """sys.stdin for the cases: reading it (a prompt) fails the test."""

    def read(self, *args):
        raise AssertionError("read stdin (a prompt)")

    readline = read

    def isatty(self):
        return False

    def fileno(self):
        raise OSError("no stdin")


def _fill(item, root: Path):
    return [a.replace("{w}", str(root)) for a in item] if isinstance(item, list) else item.replace("{w}", str(root))


def _one_line(code, out: str, err: str, expected: str) -> None:
    assert code == 2, (code, out, err)
    assert "Traceback" not in err and out == "", (out, err)
    lines = err.splitlines()
    assert len(lines) == 1 and err.endswith("\n"), err
    assert expected in lines[0], lines[0]


def _in_process(argv: list[str], capsys):
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def in_world(world, monkeypatch):
    monkeypatch.chdir(world)
    monkeypatch.setenv("NIPFLOW_RUNS_DIR", str(world / "store"))
    monkeypatch.setenv("NIPFLOW_DATA_DIR", str(world / "data"))
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    for name in ("NIPFLOW_API_SERVER_KEY", "PREFECT_SERVER_API_AUTH_STRING"):  # the --host cases need none
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(sys, "stdin", NoStdin())
    before = snapshot(world)
    yield world
    assert snapshot(world) == before  # nothing created, nothing changed


@pytest.mark.parametrize("argv, expected", CASES, ids=[" ".join(c[0])[:60] or "(none)" for c in CASES])
def test_a_bad_value_exits_2_with_one_line_naming_it(in_world, capsys, argv, expected):
    code, out, err = _in_process(_fill(argv, in_world), capsys)
    _one_line(code, out, err, _fill(expected, in_world))


@pytest.mark.parametrize("env, argv, expected", ENV_CASES, ids=[c[1][0] for c in ENV_CASES])
def test_a_bad_default_from_the_environment_is_named_too(in_world, monkeypatch, capsys, env, argv, expected):
    for name, value in env.items():
        monkeypatch.setenv(name, _fill(value, in_world))
    code, out, err = _in_process(_fill(argv, in_world), capsys)
    _one_line(code, out, err, expected)


def test_real_processes_exit_2_with_only_that_line_on_stderr(world):
    """The exit status and the bytes a shell sees, for a few representative cases (in parallel)."""
    cases = [([*GI, "--run-id", "r1", "--device", "gpu"], "--device"),  # against the existing run r1
             ([*GI, "--runs-dir", UNDER_A_FILE], "--runs-dir"),
             ([*GI, "--checkpoint-every", "-1"], "--checkpoint-every"),
             (["api-server", "--port", "70000"], "--port"),
             (["worker", "--pool", "p", "--limit", "abc"], "--limit")]
    env = {**os.environ, "PYTHONPATH": str(REPO), "NIPFLOW_RUNS_DIR": str(world / "store"),
           "NIPFLOW_DATA_DIR": str(world / "data")}
    before = snapshot(world)
    procs = [subprocess.Popen([sys.executable, "-m", "flows.cli", *_fill(argv, world)], cwd=world, env=env,
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for argv, _ in cases]
    for proc, (argv, expected) in zip(procs, cases):
        out, err = proc.communicate(timeout=180)
        _one_line(proc.returncode, out, err, expected)
    assert snapshot(world) == before

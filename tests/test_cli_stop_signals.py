"""SIGTERM and SIGHUP stop ``nipflow run``, ``resume`` and ``sweep`` like Ctrl-C, at any moment.

Real commands in their own sessions, signalled outside a TensorDict training loop (a text
run waiting for its fine-tune job, a sweep while Prefect's temporary server starts), as a
supervisor or a closing terminal would: the command exits 143 (SIGTERM) or 129 (SIGHUP)
after its clean-up, so that no process it started is left (the local API server it
auto-started, Prefect's temporary server), the run store records the invocation as
interrupted and the result card says so.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nipflow_llm_server.server.cli import read_server_file

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
#: A text run whose first iteration gives the verifier group one fine-tune job (about 25 s
#: long on the auto-started server), so that the run waits for it.
TEXT_RUN = ["--protocol", "nip", "--set", "rl.num_iterations=2", "--set", "rl.rollouts_per_iteration=16",
            "--set", "dataset_options.max_train_size=16", "--set", "dataset_options.max_test_size=2",
            "--set", "text_rl.test_scheme=last"]
WAITING = ("validating_files", "queued", "running")


def _proc_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, start time in clock ticks) of every process."""
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            table[int(name)] = (int(fields[1]), fields[19])
    return table


class ProcessTree:
    """Every process started below ``root`` while it was watched (:meth:`watch`), by pid and start time."""

    def __init__(self, root: int):
        self.root = root
        self.seen: dict[int, str] = {}
        self.command_lines: dict[int, str] = {}

    def watch(self) -> None:
        table = _proc_table()
        parents = {self.root, *self.seen}
        grew = True
        while grew:
            found = {pid: start for pid, (ppid, start) in table.items() if ppid in parents and pid not in self.seen}
            self.seen.update(found)
            parents |= set(found)
            grew = bool(found)
        for pid, start in self.seen.items():  # read again: a child caught between fork and exec shows ours
            if pid in table and table[pid][1] == start:
                try:
                    line = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                except OSError:
                    continue
                if line:  # a zombie's is empty
                    self.command_lines[pid] = line

    def alive(self) -> list[int]:
        """The watched descendants still running (same pid and start time, not a zombie)."""
        table = _proc_table()
        running = []
        for pid, start in self.seen.items():
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if pid in table and table[pid][1] == start and state != "Z":
                running.append(pid)
        return running

    def commands(self) -> list[str]:
        """The command lines of the watched descendants, as last seen."""
        return list(self.command_lines.values())


class Command:
    """A ``nipflow`` command in its own session, its output in files, its process tree watched."""

    def __init__(self, root: Path, *args: str):
        env = {**os.environ, "PYTHONPATH": str(REPO), "NIPFLOW_DATA_DIR": str(root / "data")}
        env.pop("OPENAI_BASE_URL", None)
        self.out, self.err = root / f"{args[0]}.out", root / f"{args[0]}.err"
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "flows.cli", *args], env=env, cwd=root,
                                         stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True)
        self.tree = ProcessTree(self.proc.pid)

    def wait_for(self, condition, what: str, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            self.tree.watch()
            assert self.proc.poll() is None, f"exited {self.proc.returncode} before {what}:\n{self.stderr()[-3000:]}"
            assert time.monotonic() < deadline, f"no {what} after {timeout} s:\n{self.stderr()[-3000:]}"
            time.sleep(0.05)
        self.tree.watch()

    def stop(self, sig: int, timeout: float = 90) -> int:
        self.proc.send_signal(sig)
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            self.tree.watch()
            if time.monotonic() > deadline:
                self.proc.kill()
                pytest.fail(f"still running {timeout} s after {signal.Signals(sig).name}:\n{self.stderr()[-3000:]}")
            time.sleep(0.05)
        return self.proc.returncode

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def stdout(self) -> str:
        return self.out.read_text(errors="replace")

    def assert_nothing_left(self) -> None:
        deadline = time.monotonic() + 5  # init reaps the orphans it inherited
        while self.tree.alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert self.tree.alive() == [], (self.tree.commands(), self.stderr()[-3000:])

    def kill_tree(self) -> None:
        """After a failure: SIGKILL what is left (by pid and start time, never a reused pid)."""
        if self.proc.poll() is None:
            self.tree.watch()
            self.proc.kill()
        for pid in self.tree.alive():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()


def _json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _invocations(run: Path) -> list[dict]:
    return (_json(run / "metadata.json") or {}).get("invocations") or []


def test_sigterm_stops_a_text_run_waiting_for_its_fine_tune_job_and_sighup_its_resume(tmp_path):
    runs, llm = tmp_path / "runs", tmp_path / "runs" / ".llm-server"
    run = runs / "t"

    def waiting_for_the_job() -> bool:
        groups = (_json(run / "state.json") or {}).get("shared_model_groups") or {}
        return read_server_file(llm) is not None and any(g.get("last_status") in WAITING for g in groups.values())

    # -- nipflow run through Prefect (temporary server), SIGTERM while it waits for the job
    command = Command(tmp_path, "run", "code_validation", "pure_text_ei", *TEXT_RUN, "--run-id", "t",
                      "--runs-dir", str(runs), "--no-wandb", "--progress", "off")
    try:
        command.wait_for(waiting_for_the_job, "fine-tune job")
        server = read_server_file(llm)
        assert command.stop(signal.SIGTERM) == 143, command.stderr()[-3000:]
        command.assert_nothing_left()
    finally:
        command.kill_tree()
    assert server["pid"] in command.tree.seen  # the auto-started server was one of its processes ...
    assert any("uvicorn" in c and "prefect.server" in c for c in command.tree.commands())  # ... and Prefect's
    err = command.stderr()
    assert "nipflow: stopped by SIGTERM" in err and f"stopped the local API server of {llm}" in err
    assert read_server_file(llm) is None and not (llm / "autostarted.json").exists()
    assert "status          interrupted: stopped by SIGTERM" in command.stdout()
    assert [(i["status"], i.get("message")) for i in _invocations(run)] == [("interrupted", "stopped by SIGTERM")]

    # -- nipflow resume --direct, SIGHUP once it drives the run again with a new server
    def resumed() -> bool:
        return len(_invocations(run)) == 2 and (llm / "autostarted.json").exists()

    command = Command(tmp_path, "resume", "t", "--direct", "--runs-dir", str(runs), "--no-wandb", "--progress", "off")
    try:
        command.wait_for(resumed, "second invocation")
        server = read_server_file(llm)
        assert command.stop(signal.SIGHUP) == 129, command.stderr()[-3000:]
        command.assert_nothing_left()
    finally:
        command.kill_tree()
    assert server["pid"] in command.tree.seen
    err = command.stderr()
    assert "nipflow: stopped by SIGHUP" in err and f"stopped the local API server of {llm}" in err
    assert read_server_file(llm) is None
    assert "status          interrupted: stopped by SIGHUP" in command.stdout()
    assert [(i["status"], i.get("message")) for i in _invocations(run)] == [
        ("interrupted", "stopped by SIGTERM"), ("interrupted", "stopped by SIGHUP")]


def test_sigterm_stops_a_sweep_while_prefects_temporary_server_starts(tmp_path):
    sweep = tmp_path / "sweep.json"
    sweep.write_text(json.dumps({"variants": {"nip": {"interaction_protocol": "nip"}}, "grid": {"seed": [1, 2]}}))
    command = Command(tmp_path, "sweep", str(sweep), "--params", str(REPO / "configs" / "gi_nip_ppo_small.json"),
                      "--set", "dataset=test", "--set", "rl.num_iterations=1", "--sweep-id", "sw",
                      "--runs-dir", str(tmp_path / "runs"), "--no-wandb", "--progress", "off")
    try:
        command.wait_for(lambda: any("uvicorn" in c for c in command.tree.commands()), "temporary server")
        assert "Beginning flow run" not in command.stderr()  # still starting up
        assert command.stop(signal.SIGTERM) == 143, command.stderr()[-3000:]
        command.assert_nothing_left()
    finally:
        command.kill_tree()
    assert "nipflow: stopped by SIGTERM" in command.stderr()
    assert not (tmp_path / "runs" / "sw-0").exists()  # stopped before any point started


def test_sigterm_during_tensordict_training_through_prefect_checkpoints_and_stops_without_a_retry(tmp_path):
    """Inside an RL block the preemption guard checkpoints; the block is not retried in this
    process (it was asked to stop): the command exits 75 (preempted) with nothing left."""
    run = tmp_path / "runs" / "gi"
    tiny = ["--set", "rl.num_iterations=300", "--set", "rl.frames_per_batch=16", "--set", "rl.num_epochs=1",
            "--set", "rl.minibatch_size=8", "--set", "agents._default.num_gnn_layers=1",
            "--set", "agents._default.d_gnn=2"]
    command = Command(tmp_path, "run", "graph_isomorphism", "vanilla_ppo", "--dataset", "test", *tiny,
                      "--run-id", "gi", "--runs-dir", str(tmp_path / "runs"), "--no-wandb", "--progress", "off")

    def training() -> bool:
        metrics = run / "metrics.jsonl"
        return metrics.exists() and len(metrics.read_text().splitlines()) >= 2

    try:
        command.wait_for(training, "two iterations")
        assert command.stop(signal.SIGTERM) == 75, command.stderr()[-3000:]
        command.assert_nothing_left()
    finally:
        command.kill_tree()
    err = command.stderr()
    assert "nipflow: training preempted by SIGTERM: checkpoint of iteration" in err
    # no retry of the block in this process (one used to fail on the W&B run still open, exit 1)
    assert "AwaitingRetry" not in err and "is in use" not in err
    assert "status          interrupted: training preempted by SIGTERM" in command.stdout()
    state = _json(run / "state.json")
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert state["iteration"] == len(lines) >= 2  # the checkpoint of the last finished iteration
    (invocation,) = _invocations(run)
    assert invocation["status"] == "interrupted" and "preempted by SIGTERM" in invocation["message"]

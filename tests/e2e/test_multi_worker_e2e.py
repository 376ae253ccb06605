"""Several real workers against one real server: the ``gpu`` limit.

Real processes only: ``prefect server start`` on PostgreSQL, ``nipflow prefect setup --gpus 1`` and
``prefect deploy --all`` from ``deployments/prefect.yaml`` (module-wide, see
``tests/e2e/conftest.py``), and ``prefect worker start`` processes of the process type.

The trainers are the cheap fakes of ``tests/flows/nipflow_fakes.py`` (``vanilla_ppo`` and
``pure_text_ei``), with execution records that name the process and, for RL blocks, the
wall-clock interval of the block (``tests/e2e/e2e_site/e2e_fakes.py``). They reach the
flow-run processes of the workers through ``tests/e2e/e2e_site/sitecustomize.py``: that
directory is on the workers' ``PYTHONPATH`` with ``NIPFLOW_E2E_FAKES=1``, and a process
worker passes its environment to its flow runs. The deployed code is unchanged. (The real
GI trainer cannot run here on ``nipflow-gpu``: that pool's job variables set
``NIPFLOW_DEVICE=cuda``.)

1. Two GI experiments started together through ``train_experiment/nip-gi-ppo``, one CPU
   worker and *two* GPU workers: every RL block is a ``rl_iteration_block`` flow run on
   the GPU pool (``run_deployment``), and nothing but the ``gpu`` tag limit (1) keeps two
   blocks' ``train_iterations`` tasks from running at the same time.

A sweep spread over two workers in different working directories is
``tests/e2e/test_s3_multi_worker_e2e.py`` (the same sweep, on an S3 run store).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from prefect_e2e_processes import REPO, Api, setup_and_deploy, wait_for
from tests.run_files import run_json

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

HERE = Path(__file__).resolve().parent
FAKES_PATH = os.pathsep.join([str(REPO), str(REPO / "tests" / "flows"), str(HERE / "e2e_site")])
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "CRASHED"}
BLOCK_SLEEP_S = 3  # inside each block: long enough that two blocks would overlap without the limit
#: the first block of each run: longer than the start of one experiment's parent flow run can
#: lag the other's (5 s was seen on a busy machine), so that the other's first block flow run
#: is Running while this one holds the slot, and waits for it
FIRST_BLOCK_SLEEP_S = 12


def worker_env(runs_dir: Path, name: str, **extra: str) -> dict[str, str]:
    """A worker (and its flow runs) with the fake trainers and a shared run store."""
    return {"NIPFLOW_PROJECT_DIR": str(REPO), "NIPFLOW_RUNS_DIR": str(runs_dir),
            "PREFECT_WORKER_QUERY_SECONDS": "2", "PYTHONPATH": FAKES_PATH,
            "NIPFLOW_E2E_FAKES": "1", "E2E_WORKER_NAME": name, **extra}


def stop_workers_together(workers) -> None:
    """Stop idle workers at once (one SIGTERM each: ``nipflow worker`` stops its Prefect worker
    within about 8 s); the fixture's ``Worker.stop`` then finds them gone. Saves about 8 s per
    worker over stopping them one after the other."""
    for worker in workers:
        if worker.alive():
            try:
                os.killpg(worker.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    for worker in workers:
        try:
            worker.proc.wait(20)
        except subprocess.TimeoutExpired:
            pass


def records(runs_dir: Path, run_id: str, event: str) -> list[dict]:
    path = runs_dir / run_id / "executions.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    return [r for r in rows if r.get("event") == event]


def block_run_id(flow_run) -> str:
    """The nipflow run id of an ``rl_iteration_block`` flow run (from its ``spec`` parameter)."""
    return flow_run.parameters["spec"]["settings"]["run_id"]


def overlaps(intervals: list[tuple[float, float, str]]) -> list[tuple[str, str]]:
    """Pairs of labelled ``(start, end, label)`` intervals that share some time."""
    ordered = sorted(intervals)
    return [(a[2], b[2]) for i, a in enumerate(ordered) for b in ordered[i + 1:] if b[0] < a[1]]


@pytest.fixture(scope="module")
def deployed(prefect_server):
    """``nipflow prefect setup --gpus 1`` and ``prefect deploy --all``, once for the module."""
    setup_and_deploy(prefect_server)
    return Api(prefect_server.api_url)


@pytest.mark.long(120)
def test_gpu_limit_keeps_rl_blocks_of_two_experiments_apart(prefect_server, deployed, workers, tmp_path):
    started = time.monotonic()
    api = deployed
    runs_dir = tmp_path / "runs"
    with api.client() as client:  # the limit `nipflow prefect setup --gpus 1` created
        limit = client.read_concurrency_limit_by_tag("gpu")
    assert (limit.tag, limit.concurrency_limit) == ("gpu", 1)

    extra = {"E2E_BLOCK_SLEEP_S": str(BLOCK_SLEEP_S), "E2E_FIRST_BLOCK_SLEEP_S": str(FIRST_BLOCK_SLEEP_S)}
    started_workers = [
        workers.start(tmp_path / "cpu", pool="nipflow-cpu", name="cpu-1", env=worker_env(runs_dir, "cpu-1", **extra)),
        workers.start(tmp_path / "gpu-a", pool="nipflow-gpu", name="gpu-a", env=worker_env(runs_dir, "gpu-a", **extra)),
        workers.start(tmp_path / "gpu-b", pool="nipflow-gpu", name="gpu-b", env=worker_env(runs_dir, "gpu-b", **extra)),
    ]
    logs = [w.log for w in started_workers]

    run_ids = ["gi-lim-a", "gi-lim-b"]
    flow_runs = {rid: api.start("train_experiment/nip-gi-ppo", {
        "run_id": rid, "overrides": ["rl.num_iterations=2"], "block_size": 1}) for rid in run_ids}
    wait_for(lambda: all(api.flow_run(fr).state.type.value in TERMINAL for fr in flow_runs.values()),
             "both experiments to finish", 240, logs, interval=2)
    finished_after = time.monotonic() - started
    stop_workers_together(started_workers)

    states = {rid: api.flow_run(fr).state.type.value for rid, fr in flow_runs.items()}
    assert states == {rid: "COMPLETED" for rid in run_ids}

    # every block ran exactly once, each in a flow run on a GPU-pool worker
    blocks = {rid: records(runs_dir, rid, "block") for rid in run_ids}
    for rid in run_ids:
        assert [(b["start"], b["stop"]) for b in blocks[rid]] == [(0, 1), (1, 2)], blocks[rid]
        assert {b["worker"] for b in blocks[rid]} <= {"gpu-a", "gpu-b"}
        state = run_json(runs_dir / rid, "state.json")
        assert state["iteration"] == 2
    block_runs = [r for r in api.flow_runs("rl_iteration_block") if block_run_id(r) in run_ids]
    assert len(block_runs) == 4
    assert {(r.state.type.value, r.work_pool_name, "gpu" in r.tags) for r in block_runs} == {
        ("COMPLETED", "nipflow-gpu", True)}

    # no two blocks overlapped: neither as executed (the trainer's own clock) ...
    executed = [(b["t0"], b["t1"], f"{rid}[{b['start']}:{b['stop']}]@{b['worker']}")
                for rid in run_ids for b in blocks[rid]]
    assert overlaps(executed) == []
    # ... nor as the server saw the gpu-tagged tasks (Running -> Completed holds the slot)
    tasks = [t for t in api.task_runs("train_iterations") if t.flow_run_id in {r.id for r in block_runs}]
    assert len(tasks) == 4 and all("gpu" in t.tags and t.state.type.value == "COMPLETED" for t in tasks)
    served = [(t.start_time.timestamp(), t.end_time.timestamp(), t.name) for t in tasks]
    assert overlaps(served) == []
    # ... although blocks of the two experiments were running as flow runs at the same time
    # (so the limit, not the timing, kept their tasks apart: a block waited for the slot)
    running = [(r.start_time.timestamp(), r.end_time.timestamp(), block_run_id(r)) for r in block_runs]
    assert any(a != b for a, b in overlaps(running)), sorted(running)

    t_zero = min(b[0] for b in executed)
    print(f"\nboth experiments finished after {finished_after:.1f} s")
    for t0, t1, label in sorted(executed):
        print(f"block {label}: {t0 - t_zero:6.2f} .. {t1 - t_zero:6.2f} s")
    by_block_run = sorted((r.start_time.timestamp(), r.end_time.timestamp(), r.name, block_run_id(r))
                          for r in block_runs)
    for s, e, name, rid in by_block_run:
        print(f"flow run {rid}/{name}: running {s - t_zero:6.2f} .. {e - t_zero:6.2f} s")
    for rid, fr in flow_runs.items():
        run = api.flow_run(fr)
        print(f"experiment {rid}: created {run.created.timestamp() - t_zero:6.2f}, running "
              f"{run.start_time.timestamp() - t_zero:6.2f} .. {run.end_time.timestamp() - t_zero:6.2f} s")

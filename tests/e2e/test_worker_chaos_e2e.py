"""Workers SIGKILLed at seeded random moments while a deployed text run and a deployed GI run train.

Real processes only (PostgreSQL-backed ``prefect server start``, ``nipflow prefect setup``
with its automations, ``prefect deploy --all`` from ``deployments/prefect.yaml``, process
workers, the local OpenAI-compatible server). Two runs start at once through their
deployments, as an operator starts them (a few fields on top of the deployment's):

* ``train_experiment/cv-ei``: real ``pure_text_ei``, 3 iterations, suspending on its two
  fine-tune waits, resumed by the (10 s) fine-tune watcher;
* ``train_experiment/nip-gi-ppo``: real tiny ``vanilla_ppo``, 4 iterations in 4 RL blocks on
  the ``nipflow-gpu`` pool.

Three kills, each of one pool's worker with its process group and every flow-run process it
started (a host death), each followed after a seeded pause by a new worker in another
working directory:

1. mid-RL-block: a seeded moment while a block of the GI run is Running (the gpu worker);
2. mid-stage: a seeded moment while the text run is Running a stage (the cpu worker, which
   also runs the GI run's parent flow: the block it started trains on under the parent's
   claim, and the parent, rescheduled, waits for that claim to end);
3. a seeded moment of the next 40 s, on a seeded pool.

Nothing in the test repairs anything: the runs that died with a worker are marked Crashed
by the automations and put back to Scheduled; a crashed block is dispatched again. The
automations are those of ``deployments/automations.yaml`` with a shorter window, for speed
only: a run is crashed after WINDOW_S = 50 s without a heartbeat instead of 90 s (flow runs
send one every 30 s, the least Prefect accepts: a heartbeat may come up to 20 s late, and a
flow-run process has 50 s from Pending to its first one). Both runs must complete with one
fine-tune job per (iteration, group), one metrics line per (kind, iteration) and their
result card. ``NIPFLOW_CHAOS_SEED``
picks other moments (the default seed is what CI runs).
"""

from __future__ import annotations

import json
import os
import random
import time
from collections import Counter
from pathlib import Path

import pytest

from prefect_e2e_processes import (
    REPO,
    Api,
    automations_with_window,
    install_automations,
    prefect_file_with_watcher_interval,
    setup_and_deploy,
    wait_for,
)
from tests.run_files import run_file, run_json

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SEED = int(os.environ.get("NIPFLOW_CHAOS_SEED", "20261126"))
# Crashed is not final here: the reschedule automation puts a crashed run back to Scheduled
# (a run that stays Crashed is caught by the wait's timeout and its diagnosis)
FINAL = {"COMPLETED", "FAILED", "CANCELLED"}
CV_RUN, GI_RUN = "cv-chaos", "gi-chaos"
WINDOW_S = 50
CV_ITERATIONS, GI_ITERATIONS = 3, 4
TINY_GI = ["rl.frames_per_batch=16", "rl.num_epochs=1", "rl.minibatch_size=8", "rl.num_test_iterations=1",
           "rl.num_normalization_steps=3", "agents._default.num_gnn_layers=1", "agents._default.d_gnn=2"]
SMALL_CV = ["rl.num_test_iterations=1", "dataset_options.max_train_size=24", "dataset_options.max_test_size=4",
            "nip_protocol.max_message_rounds=4", "text_rl.test_scheme=last",
            "text_rl.verifier_guess_replacement_proportion=0.5"]


@pytest.fixture
def llm_server(tmp_path):
    from nipflow_llm_server.testing import local_api_server

    with local_api_server(tmp_path, job_time_scale=0.5) as server:
        yield server


class Pools:
    """One live worker per pool; :meth:`kill_and_replace` is a host death and a new host."""

    def __init__(self, workers, tmp_path: Path, env: dict[str, str]):
        self.workers, self.tmp_path, self.env = workers, tmp_path, env
        self.live: dict[str, object] = {}
        self.kills: list[str] = []
        self.started = 0

    def start(self, pool: str) -> None:
        self.started += 1
        name = f"{pool.split('-')[-1]}-{self.started}"
        self.live[pool] = self.workers.start(self.tmp_path / name, pool=pool, name=name, env=self.env)

    def kill_and_replace(self, pool: str, why: str, pause_s: float) -> None:
        worker = self.live[pool]
        killed = worker.kill()
        self.kills.append(f"{worker.name} ({why}; {len(killed)} flow-run processes)")
        time.sleep(pause_s)
        self.start(pool)

    @property
    def logs(self) -> list[Path]:
        return [w.log for w in self.workers]


def _diagnosis(api: Api, pools: Pools, runs: dict[str, str]) -> str:
    """What a stuck chaos run needs to be understood: the kills, each run's and block's state
    history, and the processes still alive under the live workers."""
    lines = [f"kills: {pools.kills}"]
    for name, fr in runs.items():
        lines.append(f"{name} states: {api.state_history(fr)}")
    for block in api.flow_runs("rl_iteration_block"):
        lines.append(f"block {block.name} (run_count {block.run_count}): {api.state_history(block.id)}")
    for pool, worker in pools.live.items():
        pids = worker.flow_run_processes()
        cmdlines = []
        for pid in pids:
            try:
                cmdlines.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:160])
            except OSError:
                pass
        lines.append(f"{pool}: worker {worker.name} alive={worker.alive()}, processes: {cmdlines}")
    return "\n".join(lines)


def _running(api: Api, flow_name: str, run_id: str, key=lambda r: r.parameters.get("run_id")) -> bool:
    return any(key(r) == run_id and r.state is not None and r.state.type.value == "RUNNING"
               for r in api.flow_runs(flow_name))


@pytest.mark.long(300)
def test_runs_complete_whatever_moment_their_workers_die(prefect_server, workers, llm_server, tmp_path):
    rng = random.Random(SEED)
    started = time.monotonic()
    api = Api(prefect_server.api_url)
    runs_dir = tmp_path / "runs"
    setup_and_deploy(prefect_server, prefect_file_with_watcher_interval(tmp_path, 10))
    _, updated = install_automations(prefect_server, automations_with_window(tmp_path, WINDOW_S))
    assert len(updated) == 2, updated
    pools = Pools(workers, tmp_path, {
        "NIPFLOW_PROJECT_DIR": str(REPO), "NIPFLOW_RUNS_DIR": str(runs_dir), "NIPFLOW_DATA_DIR": str(tmp_path / "data"),
        "OPENAI_BASE_URL": llm_server.base_url, "PREFECT_WORKER_QUERY_SECONDS": "2"})
    pools.start("nipflow-cpu")
    pools.start("nipflow-gpu")

    cv = api.start("train_experiment/cv-ei", {"run_id": CV_RUN, "num_iterations": CV_ITERATIONS,
                                              "rollouts_per_iteration": 24, "overrides": SMALL_CV})
    gi = api.start("train_experiment/nip-gi-ppo", {"run_id": GI_RUN, "num_iterations": GI_ITERATIONS,
                                                   "dataset": "test", "block_size": 1, "overrides": TINY_GI})
    block_of = (lambda r: r.parameters.get("spec", {}).get("settings", {}).get("run_id"))

    # 1. mid-RL-block
    wait_for(lambda: _running(api, "rl_iteration_block", GI_RUN, block_of), "a GI block to run", 240, pools.logs,
             interval=0.5)
    time.sleep(rng.uniform(0.5, 3.0))
    pools.kill_and_replace("nipflow-gpu", "mid-RL-block", rng.uniform(1.0, 5.0))
    # 2. mid-stage of the text run (a stage task running in its flow run)
    wait_for(lambda: _running(api, "train_experiment", CV_RUN), "the text run to run a stage", 300, pools.logs,
             interval=0.5)
    time.sleep(rng.uniform(0.5, 4.0))
    pools.kill_and_replace("nipflow-cpu", "mid-stage", rng.uniform(1.0, 5.0))
    # 3. anywhere
    time.sleep(rng.uniform(0.0, 40.0))
    pool = rng.choice(["nipflow-cpu", "nipflow-gpu"])
    pools.kill_and_replace(pool, "a random moment", rng.uniform(1.0, 5.0))

    try:
        wait_for(lambda: all(api.flow_run(fr).state.type.value in FINAL for fr in (cv, gi)),
                 "both runs to finish", 900, pools.logs, interval=2)
    except AssertionError as stuck:
        raise AssertionError(f"{stuck}\n{_diagnosis(api, pools, {'cv': cv, 'gi': gi})}") from None
    wall = time.monotonic() - started
    print(f"\nseed {SEED}: {len(pools.kills)} kills: {'; '.join(pools.kills)}; both runs final after {wall:.0f} s")
    for name, fr in (("cv", cv), ("gi", gi)):
        print(f"{name} states: {api.state_history(fr)}")
    assert len(pools.kills) == 3
    for fr in (cv, gi):
        assert api.flow_run(fr).state.type.value == "COMPLETED", api.state_history(fr)

    # one metrics line per (kind, iteration); the run store says done; the result card says completed
    for run_id, iterations in ((CV_RUN, CV_ITERATIONS), (GI_RUN, GI_ITERATIONS)):
        rows = [json.loads(line) for line in run_file(runs_dir / run_id, "metrics.jsonl").read_text().splitlines()
                if line]
        per_line = Counter((r.get("kind", "train"), r["iteration"]) for r in rows)
        assert set(per_line.values()) == {1}, per_line
        assert {it for kind, it in per_line if kind == "train"} == set(range(iterations))
        state = run_json(runs_dir / run_id, "state.json")
        assert state["iteration"] == iterations
        card = api.latest_artifact(f"{run_id}-result-card")
        assert card is not None and "completed" in card.data, card

    # the text run: exactly one fine-tune job per (iteration, group), all succeeded
    jobs = [j for j in llm_server.client().fine_tuning.jobs.list(limit=100).data
            if (j.metadata or {}).get("nipflow_run_id") == CV_RUN]
    per_slot = Counter((j.metadata["nipflow_iteration"], j.metadata["nipflow_group"]) for j in jobs)
    assert per_slot and set(per_slot.values()) == {1}, per_slot
    assert {it for it, _ in per_slot} == {str(it) for it in range(CV_ITERATIONS - 1)}
    assert all(j.status == "succeeded" for j in jobs)
    # the GI run: every block has a completed flow run (a parent that ran again under a new lease
    # generation asks for its blocks again: a finished one comes back cached); a block flow run of
    # an earlier generation, rescheduled after its crash, cannot join the parent's old claim any
    # more and fails naming the lease: fenced, it trained nothing. Nothing is left running.
    blocks = [r for r in api.flow_runs("rl_iteration_block") if block_of(r) == GI_RUN]
    print(f"blocks: {sorted((r.name, r.run_count, r.state.type.value, r.state.message) for r in blocks)}")
    assert {r.name for r in blocks if r.state.type.value == "COMPLETED"} == {
        f"rl-block-{i}[{i}:{i + 1}]" for i in range(GI_ITERATIONS)}
    for r in blocks:
        assert r.state.type.value == "COMPLETED" or (
            r.state.type.value == "FAILED" and "lease" in (r.state.message or "")), (r.name, r.state)

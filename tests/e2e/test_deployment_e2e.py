"""Deployed pipelines on real processes, started with the commands of ``deployments/README.md``
and ``deployments/prefect.yaml`` exactly as written: the code-validation pipeline survives a
worker killed in the middle of a fine-tune-watcher tick while the run is suspended, and the
GI pipeline trains its RL blocks through the gpu pool on this CPU-only machine.

Real processes only: ``prefect server start``, ``nipflow prefect setup`` + ``prefect deploy
--all`` from ``deployments/prefect.yaml``, ``prefect worker start``, the local
OpenAI-compatible server with fine-tune jobs of about 25 s, and the real ``pure_text_ei``
trainer (3 iterations of 24 rollouts; fine-tuning after iterations 0 and 1, none after the
last one, as in nip).

The flow run of ``train_experiment/cv-ei`` (``prefect deployment run ... --param run_id=cv-1
...``, which keeps the deployment's scenario, trainer, protocol and wait mode) suspends itself
on the first fine-tune wait; while its jobs run, a ``fine_tune_watcher`` tick is in flight on
the worker when the worker is SIGKILLed with its process group and every flow-run process it
started (a host death). With Prefect's deployment concurrency limit that tick held the
watcher's only slot for up to 300 s and every later tick was cancelled; the watcher has no
slot now, so a new worker in another working directory resumes the run at its next tick:
the test requires the resume within RESUME_BOUND_S of the kill. The run suspends again on the
second wait (on the new worker), is resumed again, and completes with exactly one fine-tune
job per (iteration, group).

The only difference from ``deployments/prefect.yaml`` is the watcher's schedule: it is
deployed from a copy of that file whose watcher interval is 10 s instead of 60 s, so that
the test finishes in a few minutes. The watcher still runs as the real scheduled
deployment on the worker (server scheduler -> worker -> ``fine_tune_watcher`` flow run
-> ``resume_flow_run``); nothing in the test resumes the run itself. Workers poll every
2 s (``PREFECT_WORKER_QUERY_SECONDS``) instead of 10 s, also only for speed.

``train_experiment/nip-gi-ppo`` runs the real GI ``vanilla_ppo`` trainer twice: tiny, with
the README's command (its RL blocks are ``rl_iteration_block/rl-block`` flow runs on the
worker of ``nipflow-gpu``), and at the same time with the usage line of ``prefect.yaml`` (the
deployment's own defaults, two iterations). The device is the flow parameter ``device`` (``auto``),
resolved to the CPU on this machine; ``NIPFLOW_DEVICE=cuda`` in that worker's environment
(what the pool's job variables used to set) changes nothing. A block asked for ``cuda``
explicitly fails at once, naming ``parameters.device`` and the pool, without a retry.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import pytest

from prefect_e2e_processes import (
    PREFECT_FILE,
    REPO,
    flow_run_id_of,
    prefect_file_with_watcher_interval,
    prefect_yaml_usage_command,
    readme_command,
    setup_and_deploy,
    wait_for,
)
from tests.run_files import run_json

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RUN_ID = "cv-1"  # the README's
NUM_ITERATIONS = 3  # fine-tuning after iterations 0 and 1 (none after the last, as in nip)
FINE_TUNED_ITERATIONS = range(NUM_ITERATIONS - 1)
GROUPS = {"prover", "verifier"}
WATCHER_INTERVAL_S = 10
JOB_TIME_SCALE = 1.0  # local server: 3 s validating + 2 s queued + at least 20 s running
RESUME_BOUND_S = 120  # kill -> resumed: a new worker (~15 s) + a tick (every 10 s, 3-14 s each)
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "CRASHED"}


def prefect_file_with_fast_watcher(tmp_path: Path) -> Path:
    """``deployments/prefect.yaml`` with the watcher interval set to WATCHER_INTERVAL_S."""
    return prefect_file_with_watcher_interval(tmp_path, WATCHER_INTERVAL_S)


class Api:
    """The few Prefect API reads the test needs (through Prefect's own sync client)."""

    def __init__(self, api_url: str):
        self.api_url = api_url

    def _client(self):
        from prefect.client.orchestration import SyncPrefectClient

        return SyncPrefectClient(self.api_url)

    def flow_run(self, flow_run_id):
        with self._client() as client:
            return client.read_flow_run(flow_run_id)

    def start(self, deployment_name: str, parameters: dict) -> str:
        """Create a flow run of a deployment (what ``prefect deployment run`` does); its id."""
        with self._client() as client:
            deployment = client.read_deployment_by_name(deployment_name)
            return str(client.create_flow_run_from_deployment(deployment.id, parameters=parameters).id)

    def state_history(self, flow_run_id) -> list[str]:
        """``TYPE/Name`` of every state the run has been in, oldest first."""
        with self._client() as client:
            states = client.read_flow_run_states(flow_run_id)
        states.sort(key=lambda s: s.timestamp)
        return [f"{s.type.value}/{s.name}" for s in states]

    def state_times(self, flow_run_id) -> list[tuple[datetime, str]]:
        """``(timestamp, TYPE/Name)`` of every state the run has been in, oldest first."""
        with self._client() as client:
            states = client.read_flow_run_states(flow_run_id)
        states.sort(key=lambda s: s.timestamp)
        return [(s.timestamp, f"{s.type.value}/{s.name}") for s in states]

    def state_log(self, flow_run_id) -> str:
        with self._client() as client:
            states = client.read_flow_run_states(flow_run_id)
        states.sort(key=lambda s: s.timestamp)
        return "\n".join(f"  {s.timestamp:%H:%M:%S} {s.type.value}/{s.name} {s.message or ''}" for s in states)

    def runs_of(self, flow_name: str):
        from prefect.client.schemas.filters import FlowFilter, FlowFilterName

        with self._client() as client:
            return client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=[flow_name])))

    def watcher_resume_logs(self, flow_run_id) -> list[str]:
        """The log lines in which a ``fine_tune_watcher`` run resumed ``flow_run_id``."""
        from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

        watcher_ids = [r.id for r in self.runs_of("fine_tune_watcher")]
        with self._client() as client:
            logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=watcher_ids)),
                                    limit=200)
        return [log.message for log in logs if f"({flow_run_id})" in log.message and "resuming" in log.message]


@pytest.fixture
def llm_server(tmp_path):
    from nipflow_llm_server.testing import local_api_server

    with local_api_server(tmp_path, job_time_scale=JOB_TIME_SCALE) as server:
        yield server


def start_watched(prefect_server, command: list[str], log: Path) -> tuple[subprocess.Popen, str]:
    """Start a ``prefect deployment run ... --watch`` command; it and its flow run id."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, cwd=REPO, env=prefect_server.client_env(), stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    flow_run_id = wait_for(lambda: flow_run_id_of(log.read_text()) or proc.poll() is not None,
                           "the flow run's id", 120, [log])
    assert isinstance(flow_run_id, str), log.read_text()
    return proc, flow_run_id


@pytest.mark.long(180)
def test_watcher_killed_mid_tick_stalls_nothing_and_the_suspended_run_completes(prefect_server, workers, llm_server,
                                                                                 tmp_path):
    started = time.monotonic()
    api = Api(prefect_server.api_url)
    runs_dir = tmp_path / "runs"
    worker_env = {"NIPFLOW_PROJECT_DIR": str(REPO), "NIPFLOW_RUNS_DIR": str(runs_dir),
                  "OPENAI_BASE_URL": llm_server.base_url, "PREFECT_WORKER_QUERY_SECONDS": "2"}

    setup_and_deploy(prefect_server, prefect_file_with_fast_watcher(tmp_path))
    first = workers.start(tmp_path / "worker-a", name="worker-a", env=worker_env)
    logs = [first.log, tmp_path / "watch.log"]
    command = readme_command("train_experiment/cv-ei")
    assert f"run_id={RUN_ID}" in command and f"num_iterations={NUM_ITERATIONS}" in command
    watch, flow_run_id = start_watched(prefect_server, command, logs[1])

    # 1. the run samples, creates its fine-tune jobs and suspends itself
    wait_for(lambda: api.flow_run(flow_run_id).state.name == "Suspended" or
             api.flow_run(flow_run_id).state.type.value in TERMINAL,
             "the flow run to suspend", 150, logs)
    assert api.flow_run(flow_run_id).state.name == "Suspended", api.state_history(flow_run_id)
    suspended_at = time.monotonic() - started

    # 2. a watcher tick is in flight while the jobs still run: the worker dies (SIGKILL, with
    #    its process group and every flow-run process), the tick with it
    client = llm_server.client()

    def jobs_pending() -> bool:
        jobs = client.fine_tuning.jobs.list(limit=100).data
        return bool(jobs) and any(j.status not in ("succeeded", "failed", "cancelled") for j in jobs)

    def tick_in_flight():
        ticks = [r for r in api.runs_of("fine_tune_watcher") if r.state and r.state.type.value == "RUNNING"]
        return ticks if ticks and jobs_pending() else None

    in_flight = wait_for(tick_in_flight, "a watcher tick in flight while the jobs run", 60, logs, interval=0.2)
    first.kill()
    killed_at = datetime.now(timezone.utc)
    assert jobs_pending(), "the jobs finished before the kill: the killed tick might have resumed the run"
    assert api.flow_run(flow_run_id).state.name == "Suspended"

    # 3. a new worker in another directory; the next watcher tick resumes the run
    second = workers.start(tmp_path / "worker-b", name="worker-b", env=worker_env)
    logs.append(second.log)
    wait_for(lambda: api.flow_run(flow_run_id).state.type.value in TERMINAL,
             "the flow run to finish", 300, logs)
    assert watch.wait(60) == 0, logs[1].read_text()[-3000:]  # the README's --watch command ends 0

    history = api.state_history(flow_run_id)
    print(f"\nflow run {flow_run_id} states:\n{api.state_log(flow_run_id)}")
    print(f"killed with worker-a: {first.killed_pids}; ticks in flight: {[r.name for r in in_flight]}")
    resumed_at = [ts for ts, name in api.state_times(flow_run_id) if name == "SCHEDULED/Resuming" and ts > killed_at]
    print(f"since the test started: suspended after {suspended_at:.1f} s, finished after "
          f"{time.monotonic() - started:.1f} s; resumed {(resumed_at[0] - killed_at).total_seconds():.1f} s "
          f"after the kill")
    assert (resumed_at[0] - killed_at).total_seconds() <= RESUME_BOUND_S
    final = api.flow_run(flow_run_id)
    assert final.state.type.value == "COMPLETED", history
    # the ticks after the kill ran: none was turned away for a slot the dead tick held
    cancelled = [r.name for r in api.runs_of("fine_tune_watcher") if r.state and r.state.type.value == "CANCELLED"]
    assert cancelled == []
    assert all(api.flow_run(r.id).state.type.value != "COMPLETED" for r in in_flight)  # they died mid-tick

    # one suspension per fine-tune wait (the first on worker-a, the second on worker-b),
    # each ended by a resume (Suspended -> Scheduled/Resuming), never by a crash
    suspensions = [i for i, s in enumerate(history) if s == "PAUSED/Suspended"]
    assert len(suspensions) == len(FINE_TUNED_ITERATIONS), history
    assert not any(s.startswith("CRASHED") for s in history), history
    for i in suspensions:
        assert history[i + 1] == "SCHEDULED/Resuming", history
    # ... and the resumes were the watcher's: one "resuming" log line of a watcher run each
    resumes = api.watcher_resume_logs(flow_run_id)
    assert len(resumes) == len(suspensions), resumes

    # the run store: done after the last iteration
    state = run_json(runs_dir / RUN_ID, "state.json")  # its newest version
    assert (state["iteration"], state["train_loop_stage"]) == (NUM_ITERATIONS, "done")
    suspension_keys = run_json(runs_dir / RUN_ID, "orchestration/suspensions.json")
    assert suspension_keys == {str(it): 1 for it in FINE_TUNED_ITERATIONS}

    # the llm server: exactly one fine-tune job per (iteration, group) of this run
    all_jobs = client.fine_tuning.jobs.list(limit=100).data
    jobs = [j for j in all_jobs if (j.metadata or {}).get("nipflow_run_id") == RUN_ID]
    assert len(jobs) == len(all_jobs)
    per_slot = Counter((j.metadata["nipflow_iteration"], j.metadata["nipflow_group"]) for j in jobs)
    assert set(per_slot.values()) == {1}, per_slot
    # a group with fewer than 10 examples gets no job (which groups do after iteration 0
    # depends on the fine-tuned models' samples); every job the run recorded is on the
    # server and vice versa, iteration 0 has both groups' and every wait had a job
    records = {(str(it), g): runs_dir / RUN_ID / "fine_tune" / f"iter_{it}_{g}.json"
               for it in FINE_TUNED_ITERATIONS for g in GROUPS}
    recorded = {slot for slot, path in records.items()
                if path.exists() and "job_id" in json.loads(path.read_text())}
    assert set(per_slot) == recorded
    assert {("0", g) for g in GROUPS} <= recorded
    assert {it for it, _ in recorded} == {str(it) for it in FINE_TUNED_ITERATIONS}
    assert all(j.status == "succeeded" for j in jobs)


GI_RUN_ID = "gi-1"  # the README's
GI_ITERATIONS = 2


@pytest.mark.long(215)
def test_gi_deployment_trains_on_the_cpu_through_the_gpu_pool(prefect_server, workers, tmp_path):
    started = time.monotonic()
    api = Api(prefect_server.api_url)
    runs_dir = tmp_path / "runs"
    worker_env = {"NIPFLOW_PROJECT_DIR": str(REPO), "NIPFLOW_RUNS_DIR": str(runs_dir),
                  "NIPFLOW_DATA_DIR": str(tmp_path / "data"), "PREFECT_WORKER_QUERY_SECONDS": "2"}

    setup_and_deploy(prefect_server)
    cpu = workers.start(tmp_path / "cpu", pool="nipflow-cpu", name="gi-cpu", env=worker_env)
    # what the gpu pool's job variables used to set: it must not decide the device any more
    gpu = workers.start(tmp_path / "gpu", pool="nipflow-gpu", name="gi-gpu",
                        env={**worker_env, "NIPFLOW_DEVICE": "cuda"})
    logs = [cpu.log, gpu.log, tmp_path / "watch.log"]

    # the README's command: a few --param on top of the deployment's defaults
    command = readme_command("train_experiment/nip-gi-ppo")
    assert f"run_id={GI_RUN_ID}" in command and f"num_iterations={GI_ITERATIONS}" in command
    watch, flow_run_id = start_watched(prefect_server, command, logs[2])
    # meanwhile, the usage line of prefect.yaml: the deployment's own defaults (most of its time
    # goes into generating the `small` dataset in its parent flow run; its block and the README
    # run's blocks take turns on the gpu limit)
    usage = prefect_server.cli(*prefect_yaml_usage_command()).stdout
    usage_run_id = flow_run_id_of(usage)
    assert watch.wait(400) == 0, logs[2].read_text()[-3000:]  # --watch: it ends 0 once the run completed
    finished_after = time.monotonic() - started
    final = api.flow_run(flow_run_id)
    assert final.state.type.value == "COMPLETED", f"{final.state.message}\n{api.state_log(flow_run_id)}"
    # the deployment's fields the command left alone are kept (a key-by-key merge)
    assert {k: final.parameters[k] for k in ("scenario", "trainer", "protocol", "dataset", "block_size")} == {
        "scenario": "graph_isomorphism", "trainer": "vanilla_ppo", "protocol": "nip", "dataset": "test",
        "block_size": 1}

    # every block ran once, with the real trainer, on the gpu pool's worker, on the CPU
    blocks = [r for r in api.runs_of("rl_iteration_block")
              if r.parameters.get("spec", {}).get("settings", {}).get("run_id") == GI_RUN_ID]
    assert sorted((r.name, r.run_count, r.state.type.value, r.work_pool_name) for r in blocks) == [
        (f"rl-block-{i}[{i}:{i + 1}]", 1, "COMPLETED", "nipflow-gpu") for i in range(GI_ITERATIONS)]
    assert {r.parameters["spec"]["settings"]["device"] for r in blocks} == {"auto"}  # resolved by each block
    state = run_json(runs_dir / GI_RUN_ID, "state.json")
    assert state["iteration"] == GI_ITERATIONS
    from nip_core.runs import RunStore

    data, manifest = RunStore(str(runs_dir)).open_run(GI_RUN_ID).load_checkpoint_bytes(
        f"iter_{GI_ITERATIONS:06d}")
    assert manifest["iteration"] == GI_ITERATIONS
    from nip_core.trainers.checkpoint_files import read_checkpoint

    agents = read_checkpoint(data, source="the final checkpoint")["agents"]  # safetensors: loaded on the CPU
    assert agents and {t.device.type for t in agents.values()} == {"cpu"}

    # the usage line of prefect.yaml: the deployment's own defaults, two iterations (one block)
    wait_for(lambda: api.flow_run(usage_run_id).state.type.value in TERMINAL, "the prefect.yaml run to finish",
             400, logs, interval=2)
    usage_run = api.flow_run(usage_run_id)
    assert usage_run.state.type.value == "COMPLETED", api.state_log(usage_run_id)
    usage_params = json.loads((runs_dir / usage_run.parameters["run_id"] / "hyper_params.json").read_text())
    assert (usage_params["dataset"], usage_params["rl"]["num_iterations"]) == ("small", 2)
    print(f"\nprefect.yaml usage run completed in {usage_run.total_run_time}")

    # a block asked for CUDA explicitly fails at once on this host: no retry, nothing built
    spec = {"params": blocks[0].parameters["spec"]["params"],
            "settings": {**blocks[0].parameters["spec"]["settings"], "run_id": "gi-cuda", "device": "cuda"}}
    cuda_run_id = api.start("rl_iteration_block/rl-block",
                            {"spec": spec, "block": {"index": 0, "start": 0, "stop": 1}})
    wait_for(lambda: api.flow_run(cuda_run_id).state.type.value in TERMINAL, "the cuda block to fail", 120, logs)
    cuda_run = api.flow_run(cuda_run_id)
    history = api.state_history(cuda_run_id)
    print(f"\nGI run completed after {finished_after:.1f} s; cuda block: {cuda_run.state.message}")
    assert cuda_run.state.type.value == "FAILED", history
    assert "parameters.device is 'cuda' but " in cuda_run.state.message
    assert "work pool 'nipflow-gpu'" in cuda_run.state.message
    assert cuda_run.run_count == 0 and not any(h.startswith("RUNNING") for h in history), history
    assert not (runs_dir / "gi-cuda").exists()

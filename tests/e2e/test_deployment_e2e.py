"""Deployed pipelines on real processes: the code-validation pipeline survives a worker
kill while it waits for fine-tuning, and the GI pipeline trains its RL blocks through the
gpu pool on this CPU-only machine.

Real processes only: ``prefect server start``, ``nipflow prefect setup`` + ``prefect deploy
--all`` from ``deployments/prefect.yaml``, ``prefect worker start --pool nipflow-cpu``, the
local OpenAI-compatible server with fine-tune jobs of about 12 s, and the real
``pure_text_ei`` trainer (3 iterations of 24 rollouts; fine-tuning after iterations 0
and 1, none after the last one, as in nip).

The flow run of ``train_experiment/cv-ei`` suspends itself on the first fine-tune wait;
the worker is then SIGKILLed with its process group and every flow-run process it
started (a host death: a watcher run may be in flight and die too); a new worker in
another working directory takes over; the ``fine_tune_watcher`` deployment resumes the
run once the jobs are done; the run suspends again on the second wait (on the new
worker), is resumed again, and completes with exactly one fine-tune job per
(iteration, group).

The only difference from ``deployments/prefect.yaml`` is the watcher's schedule: it is
deployed from a copy of that file whose watcher interval is 10 s instead of 60 s, so that
the test finishes in a few minutes. The watcher still runs as the real scheduled
deployment on the worker (server scheduler -> worker -> ``fine_tune_watcher`` flow run
-> ``resume_flow_run``); nothing in the test resumes the run itself. Workers poll every
2 s (``PREFECT_WORKER_QUERY_SECONDS``) instead of 10 s, also only for speed.

``train_experiment/nip-gi-ppo`` runs the real (tiny) GI ``vanilla_ppo`` trainer: its RL
blocks are ``rl_iteration_block/rl-block`` flow runs on the worker of ``nipflow-gpu``. The
device is the flow parameter ``parameters.device`` (``auto``), resolved to the CPU on this
machine; ``NIPFLOW_DEVICE=cuda`` in that worker's environment (what the pool's job
variables used to set) changes nothing. A block asked for ``cuda`` explicitly fails at
once, naming ``parameters.device`` and the pool, without a retry.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from pathlib import Path

import pytest

from prefect_e2e_processes import PREFECT, PREFECT_FILE, REPO, setup_and_deploy, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RUN_ID = "cv-e2e"
NUM_ITERATIONS = 3  # fine-tuning after iterations 0 and 1 (none after the last, as in nip)
FINE_TUNED_ITERATIONS = range(NUM_ITERATIONS - 1)
GROUPS = {"prover", "verifier"}
WATCHER_INTERVAL_S = 10
JOB_TIME_SCALE = 0.5  # local server: 1.5 s validating + 1 s queued + at least 10 s running
HYPER_PARAMS = {
    "rl": {"num_iterations": NUM_ITERATIONS, "rollouts_per_iteration": 24},
    "dataset_options": {"max_train_size": 24, "max_test_size": 4},
    "nip_protocol": {"max_message_rounds": 4},
    "text_rl": {"verifier_guess_replacement_proportion": 0.5, "test_scheme": "last"},
}
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "CRASHED"}


def prefect_file_with_fast_watcher(tmp_path: Path, *, active: bool = True) -> Path:
    """``deployments/prefect.yaml`` with the watcher interval set to WATCHER_INTERVAL_S.

    ``active=False`` deploys the watcher's schedule switched off (:meth:`Api.activate_watcher`).
    """
    text = PREFECT_FILE.read_text()
    block = "entrypoint: flows.watcher.fine_tune_watcher"
    head, tail = text.split(block)
    schedule = "- interval: 60\n        active: true"
    assert tail.count(schedule) >= 1
    tail = tail.replace(schedule, f"- interval: {WATCHER_INTERVAL_S}\n        active: {str(active).lower()}", 1)
    path = tmp_path / "prefect.yaml"
    path.write_text(head + block + tail)
    return path


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

    def state_log(self, flow_run_id) -> str:
        with self._client() as client:
            states = client.read_flow_run_states(flow_run_id)
        states.sort(key=lambda s: s.timestamp)
        return "\n".join(f"  {s.timestamp:%H:%M:%S} {s.type.value}/{s.name} {s.message or ''}" for s in states)

    def activate_watcher(self) -> None:
        """Switch the fine-tune watcher's schedules on."""
        with self._client() as client:
            deployment = client.read_deployment_by_name("fine_tune_watcher/fine-tune-watcher")
            for schedule in client.read_deployment_schedules(deployment.id):
                client.update_deployment_schedule(deployment.id, schedule.id, active=True)

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
    from nip_core.llm.testing import local_api_server

    with local_api_server(tmp_path, job_time_scale=JOB_TIME_SCALE) as server:
        yield server


def test_suspended_run_survives_worker_kill_and_completes(prefect_server, workers, llm_server, tmp_path):
    started = time.monotonic()
    api = Api(prefect_server.api_url)
    runs_dir = tmp_path / "runs"
    worker_env = {"NIPFLOW_PROJECT_DIR": str(REPO), "NIPFLOW_RUNS_DIR": str(runs_dir),
                  "OPENAI_BASE_URL": llm_server.base_url, "PREFECT_WORKER_QUERY_SECONDS": "2"}

    # The watcher's schedule starts switched off: a watcher run in flight on worker-a when it
    # is killed is left Running and holds the watcher's one concurrency slot; in one CI run
    # every tick of the next 4 minutes was cancelled (grace_period_seconds 60 notwithstanding).
    # That is a separate gap, not what this test is about. It is switched on once worker-b
    # serves the pool.
    setup_and_deploy(prefect_server, prefect_file_with_fast_watcher(tmp_path, active=False))
    first = workers.start(tmp_path / "worker-a", name="worker-a", env=worker_env)
    logs = [first.log]

    parameters = {"scenario": "code_validation", "trainer": "pure_text_ei", "protocol": "nip",
                  "wait_mode": "suspend", "run_id": RUN_ID, "params": HYPER_PARAMS}
    out = prefect_server.cli(PREFECT, "deployment", "run", "train_experiment/cv-ei",
                             "--param", f"parameters={json.dumps(parameters)}").stdout
    found = re.search(r"UUID:\s*([0-9a-f]{8}-[0-9a-f-]{27})", out)
    assert found, out
    flow_run_id = found.group(1)

    # 1. the run samples, creates its fine-tune jobs and suspends itself
    wait_for(lambda: api.flow_run(flow_run_id).state.name == "Suspended" or
             api.flow_run(flow_run_id).state.type.value in TERMINAL,
             "the flow run to suspend", 150, logs)
    assert api.flow_run(flow_run_id).state.name == "Suspended", api.state_history(flow_run_id)
    # its flow-run process has exited: no process holds the wait (watcher runs may be alive)
    suspended_at = time.monotonic() - started

    # 2. the worker dies (SIGKILL, with its process group and any flow-run process)
    first.kill()
    assert not first.alive()

    # 3. a new worker in another directory; the scheduled watcher resumes the run
    second = workers.start(tmp_path / "worker-b", name="worker-b", env=worker_env)
    logs.append(second.log)
    api.activate_watcher()
    wait_for(lambda: api.flow_run(flow_run_id).state.type.value in TERMINAL,
             "the flow run to finish", 240, logs)

    history = api.state_history(flow_run_id)
    print(f"\nflow run {flow_run_id} states:\n{api.state_log(flow_run_id)}")
    print(f"killed with worker-a: {first.killed_pids}")
    print(f"since the test started: suspended after {suspended_at:.1f} s, "
          f"finished after {time.monotonic() - started:.1f} s")
    final = api.flow_run(flow_run_id)
    assert final.state.type.value == "COMPLETED", history

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
    state = json.loads((runs_dir / RUN_ID / "state.json").read_text())
    assert (state["iteration"], state["train_loop_stage"]) == (NUM_ITERATIONS, "done")
    suspension_keys = json.loads((runs_dir / RUN_ID / "orchestration" / "suspensions.json").read_text())
    assert suspension_keys == {str(it): 1 for it in FINE_TUNED_ITERATIONS}

    # the llm server: exactly one fine-tune job per (iteration, group) of this run
    client = llm_server.client()
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


GI_RUN_ID = "gi-e2e"
GI_ITERATIONS = 2


def gi_parameters(tmp_path: Path, run_id: str, **fields) -> dict:
    """A tiny real GI vanilla_ppo experiment, one RL block per iteration."""
    from nip_core.parameters.agents import GraphIsomorphismAgentParameters

    tiny = GraphIsomorphismAgentParameters.construct_test_params().model_dump(mode="json")
    rl = {"frames_per_batch": 16, "num_iterations": GI_ITERATIONS, "num_epochs": 1, "minibatch_size": 8,
          "num_test_iterations": 1, "num_normalization_steps": 3}
    return {"scenario": "graph_isomorphism", "trainer": "vanilla_ppo", "protocol": "nip", "dataset": "test",
            "run_id": run_id, "block_size": 1, "params": {"d_representation": 2, "agents": {"_default": tiny},
                                                          "rl": rl},
            "settings_overrides": {"data_dir": str(tmp_path / "data")}, **fields}


def test_gi_deployment_trains_on_the_cpu_through_the_gpu_pool(prefect_server, workers, tmp_path):
    import io

    import torch

    started = time.monotonic()
    api = Api(prefect_server.api_url)
    runs_dir = tmp_path / "runs"
    worker_env = {"NIPFLOW_PROJECT_DIR": str(REPO), "NIPFLOW_RUNS_DIR": str(runs_dir),
                  "PREFECT_WORKER_QUERY_SECONDS": "2"}

    setup_and_deploy(prefect_server)
    cpu = workers.start(tmp_path / "cpu", pool="nipflow-cpu", name="gi-cpu", env=worker_env)
    # what the gpu pool's job variables used to set: it must not decide the device any more
    gpu = workers.start(tmp_path / "gpu", pool="nipflow-gpu", name="gi-gpu",
                        env={**worker_env, "NIPFLOW_DEVICE": "cuda"})
    logs = [cpu.log, gpu.log]

    flow_run_id = api.start("train_experiment/nip-gi-ppo", {"parameters": gi_parameters(tmp_path, GI_RUN_ID)})
    wait_for(lambda: api.flow_run(flow_run_id).state.type.value in TERMINAL, "the GI run to finish", 400, logs,
             interval=2)
    finished_after = time.monotonic() - started
    final = api.flow_run(flow_run_id)
    assert final.state.type.value == "COMPLETED", f"{final.state.message}\n{api.state_log(flow_run_id)}"

    # every block ran once, with the real trainer, on the gpu pool's worker, on the CPU
    blocks = [r for r in api.runs_of("rl_iteration_block")
              if r.parameters.get("spec", {}).get("settings", {}).get("run_id") == GI_RUN_ID]
    assert sorted((r.name, r.run_count, r.state.type.value, r.work_pool_name) for r in blocks) == [
        (f"rl-block-{i}[{i}:{i + 1}]", 1, "COMPLETED", "nipflow-gpu") for i in range(GI_ITERATIONS)]
    assert {r.parameters["spec"]["settings"]["device"] for r in blocks} == {"auto"}  # resolved by each block
    state = json.loads((runs_dir / GI_RUN_ID / "state.json").read_text())
    assert state["iteration"] == GI_ITERATIONS
    from nip_core.runs import RunStore

    data, manifest = RunStore(str(runs_dir)).open_run(GI_RUN_ID).load_checkpoint_bytes(
        f"iter_{GI_ITERATIONS:06d}")
    assert manifest["iteration"] == GI_ITERATIONS
    agents = torch.load(io.BytesIO(data), weights_only=False)["agents"]  # no map_location: as written
    assert agents and {t.device.type for t in agents.values()} == {"cpu"}

    # a block asked for CUDA explicitly fails at once on this host: no retry, nothing built
    spec = {"params": blocks[0].parameters["spec"]["params"],
            "settings": {**blocks[0].parameters["spec"]["settings"], "run_id": "gi-e2e-cuda", "device": "cuda"}}
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
    assert not (runs_dir / "gi-e2e-cuda").exists()

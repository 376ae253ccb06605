"""A sweep over two workers whose run store and Prefect results live on S3.

The multi-host set-up of ``docs/deployment.md``, on one machine, with real processes
only: ``prefect server start`` on PostgreSQL, moto's standalone S3 server
(``moto_server``, a real HTTP S3 endpoint), ``nipflow prefect setup`` + ``prefect deploy
--all`` from ``deployments/prefect.yaml`` and two ``prefect worker start`` processes of
``nipflow-cpu`` in separate working directories with separate ``PREFECT_HOME``s. The two
workers share nothing but the Prefect API and the bucket:

* the run store is ``runs_dir = s3://nipflow-e2e/runs``, given as a *flow parameter*
  (the workers' own ``NIPFLOW_RUNS_DIR`` points at local decoy directories, which must
  stay empty);
* stage results go to ``<run>/results`` on S3 through the ``RemoteFileSystem`` block that
  ``tasks.persistence.result_storage_for`` registers on the server;
* flow results go to S3 through ``PREFECT_RESULTS_DEFAULT_STORAGE_BLOCK`` (a
  ``RemoteFileSystem`` block at ``s3://nipflow-e2e/prefect-results``);
* credentials and the endpoint come from the workers' environment (``AWS_*``), never from
  parameters or blocks.

The trainers are the cheap fake ``pure_text_ei`` of the other multi-worker test (see
``tests/e2e/test_multi_worker_e2e.py``), recording every stage execution in the run's
``executions.jsonl`` - on S3 here.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import sys
import time
from pathlib import Path

import pytest

from nip_core.runs.fencing import untagged
from prefect_e2e_processes import REPO, Api, setup_and_deploy, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

HERE = Path(__file__).resolve().parent
FAKES_PATH = os.pathsep.join([str(REPO), str(REPO / "tests" / "flows"), str(HERE / "e2e_site")])
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "CRASHED"}
BUCKET = "nipflow-e2e"
RUNS_URL = f"s3://{BUCKET}/runs"
FLOW_RESULTS_URL = f"s3://{BUCKET}/prefect-results"
FLOW_RESULTS_BLOCK = "nipflow-e2e-flow-results"
SWEEP_ID = "sw-s3"
SEEDS = [1, 2, 3, 4]
# the fake pure-text trainer with rl.num_iterations=1: the stages of iteration 0, then the test
STAGES = [(0, "sample_rollouts"), (0, "log_stats"), (0, "test_during_training"), (0, "create_fine_tune_jobs"),
          (0, "await_fine_tune_jobs"), (1, "test")]

REGISTER_FLOW_RESULTS = f"""
from prefect.filesystems import RemoteFileSystem
RemoteFileSystem(basepath={FLOW_RESULTS_URL!r}).save({FLOW_RESULTS_BLOCK!r}, overwrite=True)
"""


@pytest.fixture(scope="module")
def deployed(prefect_server, s3_server):
    """The bucket, the deployments and the flow-result block, once for the module."""
    s3_server.create_bucket(BUCKET)
    setup_and_deploy(prefect_server)
    prefect_server.cli(sys.executable, "-c", REGISTER_FLOW_RESULTS, env=prefect_server.client_env(**s3_server.env()))
    return Api(prefect_server.api_url)


def read_jsonl(fs, path: str) -> list[dict]:
    return [json.loads(line) for line in fs.cat_file(path).decode().splitlines() if line.strip()]


@pytest.mark.long(100)
def test_sweep_on_s3_spreads_over_two_workers_and_runs_every_stage_once(
        prefect_server, s3_server, deployed, workers, tmp_path):
    started = time.monotonic()
    api = deployed
    names = ["s3-w1", "s3-w2"]
    decoys = {name: tmp_path / f"local-runs-{name}" for name in names}
    started_workers = [
        workers.start(tmp_path / f"wd-{name}", pool="nipflow-cpu", name=name, limit=2, env={
            **s3_server.env(), "NIPFLOW_PROJECT_DIR": str(REPO), "NIPFLOW_RUNS_DIR": str(decoys[name]),
            "PREFECT_RESULTS_DEFAULT_STORAGE_BLOCK": f"remote-file-system/{FLOW_RESULTS_BLOCK}",
            "PREFECT_WORKER_QUERY_SECONDS": "2", "PYTHONPATH": FAKES_PATH, "NIPFLOW_E2E_FAKES": "1",
            "E2E_WORKER_NAME": name})
        for name in names]
    logs = [w.log for w in started_workers]

    sweep_run = api.start("sweep/sweep", {
        "scenario": "code_validation", "trainer": "pure_text_ei", "protocol": "nip",
        "overrides": ["rl.num_iterations=1"], "runs_dir": RUNS_URL,
        "grid": {"seed": SEEDS}, "sweep_id": SWEEP_ID, "deployment_name": "train_experiment/sweep-point"})
    wait_for(lambda: api.flow_run(sweep_run).state.type.value in TERMINAL, "the sweep to finish", 300, logs,
             interval=2)
    finished_after = time.monotonic() - started
    sweep = api.flow_run(sweep_run)
    assert sweep.state.type.value == "COMPLETED", (sweep.state, [p.read_text()[-3000:] for p in logs])

    # one flow run per point, completed on its first attempt
    run_ids = [f"{SWEEP_ID}-{i:03d}" for i in range(len(SEEDS))]
    children = [r for r in api.flow_runs("train_experiment")
                if r.parameters.get("run_id", "").startswith(SWEEP_ID)]
    assert sorted(r.parameters["run_id"] for r in children) == run_ids
    assert {(r.state.type.value, r.work_pool_name, r.run_count) for r in children} == {("COMPLETED", "nipflow-cpu", 1)}
    by_run_id = {r.parameters["run_id"]: r for r in children}

    fs = s3_server.fs()
    placement = {}
    for rid in run_ids:
        run_dir = f"{BUCKET}/runs/{rid}"
        # the run directory, with its parameters and final state, is on S3 ...
        assert fs.exists(f"{run_dir}/hyper_params.json")
        versions = [p.rsplit("/", 1)[1] for p in fs.ls(run_dir, detail=False)]  # the newest epoch's is read
        state_name = max((n for n in versions if untagged(n)[0] == "state.json"), key=lambda n: untagged(n)[1])
        state = json.loads(fs.cat_file(f"{run_dir}/{state_name}"))
        assert (state["iteration"], state["train_loop_stage"]) == (1, "done")
        # ... every stage ran exactly once ...
        executions = read_jsonl(fs, f"{run_dir}/executions.jsonl")
        ended = [(e["iteration"], e["stage"]) for e in executions if e["event"] == "end"]
        assert sorted(ended) == sorted(STAGES), executions
        # ... in the flow-run process of one worker, in its own working directory and home
        (proc,) = [e for e in executions if e["event"] == "process"]
        assert proc["worker"] in names
        assert proc["prefect_home"] == str(tmp_path / f"wd-{proc['worker']}" / "prefect-home")
        assert proc["cwd"] == str(REPO)  # the deployment's pull step: NIPFLOW_PROJECT_DIR
        assert by_run_id[rid].infrastructure_pid.split(":")[-1] == str(proc["pid"])
        placement[rid] = proc["worker"]
        # the stage results are Prefect result records in <run>/results on S3, one per stage
        results = {Path(p).name: p for p in fs.ls(f"{run_dir}/results", detail=False)}
        for iteration, stage in STAGES:
            (key,) = [k for k in results if k.endswith(f"--it{iteration}--{stage}")]
            record = json.loads(fs.cat_file(results[key]))
            assert record["metadata"]["serializer"]["type"] == "json"
            assert json.loads(record["result"])["stage"] == stage
    assert set(placement.values()) == set(names), placement  # both workers trained points

    # the stage results were written through the block result_storage_for registered:
    # a RemoteFileSystem block on the server whose base path is the run's results folder
    from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterFlowRunId

    with api.client() as client:
        task_runs = client.read_task_runs(task_run_filter=TaskRunFilter(
            flow_run_id=TaskRunFilterFlowRunId(any_=[r.id for r in children])))
        stage_runs = [t for t in task_runs if t.name.split("[")[0] in {s for _, s in STAGES}]
        assert len(stage_runs) == len(run_ids) * len(STAGES)
        assert {t.state.name for t in stage_runs} == {"Completed"}  # executed, none Cached or failed
        for t in stage_runs:
            rid = next(r for r, fr in by_run_id.items() if fr.id == t.flow_run_id)
            block = client.read_block_document(t.state.data.storage_block_id)
            assert block.block_type.slug == "remote-file-system"
            assert block.data["basepath"] == f"{RUNS_URL}/{rid}/results"
            assert fs.exists(f"{BUCKET}/runs/{rid}/results/{t.state.data.storage_key}")
            assert "AWS" not in json.dumps(block.data)  # credentials come from the environment only

    # flow results (the sweep's rows, each point's summary) are on S3 too, in the default block
    flow_block = api.block_id("remote-file-system", FLOW_RESULTS_BLOCK)
    for run in [sweep, *children]:
        assert str(run.state.data.storage_block_id) == flow_block
        assert fs.exists(f"{BUCKET}/prefect-results/{run.state.data.storage_key}")
    # the sweep's result (pickled, base64) is its summary rows, readable from S3 alone
    payload = fs.cat_file(f"{BUCKET}/prefect-results/{sweep.state.data.storage_key}")
    rows = pickle.loads(base64.b64decode(payload))  # plain lists and dicts: no code is loaded
    assert [(r["run_id"], r["seed"], r["state"]) for r in rows] == [
        (rid, seed, "Completed") for rid, seed in zip(run_ids, SEEDS)]

    # the sweep read each point's metrics from S3 for its summary table
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with api.client() as client:
        (artifact,) = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[f"{SWEEP_ID}-sweep"])))
    table = json.loads(artifact.data) if isinstance(artifact.data, str) else artifact.data
    assert [(row["run_id"], row["seed"], row["state"]) for row in table] == [
        (rid, seed, "Completed") for rid, seed in zip(run_ids, SEEDS)]
    assert all("accuracy" in row for row in table), table

    # nothing went to a worker's local run store or to the project directory
    assert not any(path.exists() and any(path.iterdir()) for path in decoys.values())
    assert not any((REPO / "runs" / rid).exists() for rid in run_ids)

    print(f"\nS3 sweep finished after {finished_after:.1f} s; points per worker: {placement}")

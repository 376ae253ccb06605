"""The pure-text flow with the real ``pure_text_ei`` trainer: SIGKILL in every stage, then resume.

A child process (``run_real_pure_text.py``) runs ``train_experiment`` against the test's
Prefect server and the local OpenAI-compatible server; the test-only
``NIPFLOW_TEST_KILL_AT`` makes it SIGKILL itself at the points of :data:`KILLS`, each
once (markers), through the point hook of :mod:`tests.kill_points`. The same run id is
started again until a flow run completes, and every flow run is checked through the
Prefect API.

What a restart must do depends on where the previous process died:

* ``start``, ``before_save`` (sampling done, rollouts not written) and ``after_prover``
  (the prover's job created and its id saved in the state, the verifier's not): the
  state still names the killed stage, so the stage **executes again** in the new flow
  run (task ``Completed``, summary without ``recovered_from_state``). ``before_save``
  samples anew (no rollout file was written); ``after_prover`` adopts the prover's job
  (found on the server by its metadata) and creates only the verifier's.
* ``end``: the stage function ran and the state was saved, but the process died before
  Prefect persisted the task's result. The task is not ``Cached`` in the new flow run; it
  runs (``Completed``), finds the stored state past the stage and returns
  ``recovered_from_state`` without calling the trainer.
* Every stage whose task completed in an earlier flow run is ``Cached``.

The final state must equal an uninterrupted run's (run id ``clean``, same servers), up
to what legitimately differs between two run ids: the local server seeds a fine-tuned
model's sampling with the model's name, which holds the run id (job suffix) and the
random job id, so iteration-1 rollouts, hence ``tokens_used``, differ; the state is
compared with ``tokens_used`` dropped, job ids reduced to "set" and model names reduced
to their base model. Iteration-0 rollouts and the uploaded fine-tune data (made before
any fine-tuned model exists) must be byte-identical.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.run_files import run_json

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

HERE = Path(__file__).resolve().parent

STAGES = [(0, "sample_rollouts"), (0, "log_stats"), (0, "test_during_training"), (0, "create_fine_tune_jobs"),
          (0, "await_fine_tune_jobs"), (1, "sample_rollouts"), (1, "log_stats"), (1, "test_during_training"),
          (2, "test")]  # test_scheme=last: no fine-tuning after the last iteration
TASK_NAMES = [f"{stage}[it={it}]" for it, stage in STAGES]

# One kill per stage of iteration 0, one between the two groups' job creations, one in
# iteration 1 and one in the final test stage; attempt n dies at KILLS[n].
KILLS = ["0:sample_rollouts:before_save", "0:log_stats:end", "0:test_during_training:start",
         "0:create_fine_tune_jobs:after_prover", "0:create_fine_tune_jobs:end", "0:await_fine_tune_jobs:end",
         "1:sample_rollouts:end", "2:test:start"]


def _stage_index(point: str) -> int:
    it, stage, _ = point.split(":")
    return STAGES.index((int(it), stage))


def _expected_task_states(attempt: int) -> dict[str, str]:
    """Final task-run states of flow run ``attempt``: Cached before the stage the previous
    attempt died in, Completed from there up to the stage this attempt dies in."""
    lo = _stage_index(KILLS[attempt - 1]) if attempt > 0 else 0
    hi = _stage_index(KILLS[attempt]) if attempt < len(KILLS) else len(STAGES)
    return {**{TASK_NAMES[i]: "Cached" for i in range(lo)},
            **{TASK_NAMES[i]: "Completed" for i in range(lo, hi)}}


# Stages whose completing task found the state already past them: killed at "end" (for
# create_fine_tune_jobs the "end" kill came after the "after_prover" one).
RECOVERED = {TASK_NAMES[_stage_index(p)] for p in KILLS if p.endswith(":end")}


def _params(runs_dir: Path, run_id: str, base_url: str):
    from flows.parameters import ExperimentParameters

    return ExperimentParameters(
        scenario="code_validation", trainer="pure_text_ei", run_id=run_id, runs_dir=str(runs_dir),
        wait_mode="poll",
        overrides=["rl.num_iterations=2", "rl.rollouts_per_iteration=24", "rl.num_test_iterations=1",
                   "dataset_options.max_train_size=24", "dataset_options.max_test_size=4",
                   "nip_protocol.max_message_rounds=4", "text_rl.verifier_guess_replacement_proportion=0.5",
                   "text_rl.test_scheme=last"],
        settings_overrides={"openai_base_url": base_url, "fine_tune_poll_interval_s": 0.1,
                            "fine_tune_poll_max_interval_s": 0.5, "max_concurrent_requests": 8})


def _flow_run_id(tag: str) -> str:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[tag])))
    assert len(runs) == 1, f"{len(runs)} flow runs tagged {tag}"
    return str(runs[0].id)


def _final_task_states(flow_run_id: str, expected: dict[str, str], timeout: float = 20.0) -> dict[str, str]:
    """Task run name -> final state name (the server records task runs from events,
    asynchronously): waits until the expected names are there or ``timeout`` passes."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while True:
            runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
            names = {r.name: r.state.name for r in runs if r.state is not None and r.state.is_final()}
            if set(expected) <= set(names) or time.monotonic() > deadline:
                return names
            time.sleep(0.2)


def _rollout_files(run_dir: Path) -> dict[str, tuple[str, int]]:
    folder = run_dir / "rollouts"
    return {p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(folder.glob("*.json"))} if folder.exists() else {}


def _stage_result(run_dir: Path, task_name: str) -> dict:
    """The persisted summary of a stage task (the run-keyed result file in ``<run>/results``)."""
    stage, it = task_name[:-1].split("[it=")
    [path] = (run_dir / "results").glob(f"*--it{it}--{stage}")
    envelope = json.loads(path.read_text())
    return json.loads(envelope["result"])


def _comparable_state(run_dir: Path) -> dict:
    state = run_json(run_dir, "state.json")
    state.pop("tokens_used")
    for g in state["shared_model_groups"].values():  # job ids are random; model names carry run and job ids
        g["fine_tune_job_id"] = g["fine_tune_job_id"] is not None
        g["fine_tuned_model_name"] = (g["fine_tuned_model_name"] or "").split(":")[1:2]
    return state


def _jobs_of(client, run_id: str) -> list:
    return [j for j in client.fine_tuning.jobs.list(limit=100).data
            if (j.metadata or {}).get("nipflow_run_id") == run_id]


def test_real_pure_text_flow_sigkilled_in_every_stage_resumes_to_the_clean_result(
        prefect_server, subprocess_env, tmp_path):
    import torch

    torch.set_num_threads(1)
    from flows.experiment import train_experiment
    from nipflow_llm_server.testing import local_api_server

    runs = tmp_path / "runs"
    markers = tmp_path / "markers"
    markers.mkdir()
    with local_api_server(tmp_path, job_time_scale=0.02) as server:
        # -- the uninterrupted reference, in this process
        clean = train_experiment(**_params(runs, "clean", server.base_url).flow_parameters(), return_state=True)
        assert clean.is_completed(), clean.message
        assert clean.result()["iteration"] == 2
        clean_states = _final_task_states(clean.state_details.flow_run_id, dict.fromkeys(TASK_NAMES))
        assert clean_states == dict.fromkeys(TASK_NAMES, "Completed")
        assert not any(_stage_result(runs / "clean", n).get("recovered_from_state") for n in TASK_NAMES)

        # -- the killed run: one child process per attempt, same run id each time
        params_json = _params(runs, "killed", server.base_url).model_dump_json()
        env = {**subprocess_env, "NIPFLOW_TEST_KILL_AT": ",".join(KILLS), "NIPFLOW_TEST_KILL_MARKERS": str(markers)}
        seen: dict[str, tuple[str, int]] = {}
        for attempt in range(len(KILLS) + 1):
            tag = f"killed-attempt-{attempt}"
            proc = subprocess.run([sys.executable, str(HERE / "run_real_pure_text.py"), params_json, tag],
                                  env=env, capture_output=True, text=True, timeout=180)
            last = attempt == len(KILLS)
            assert proc.returncode == (0 if last else -signal.SIGKILL), \
                f"attempt {attempt}: exit {proc.returncode}\n{proc.stderr[-4000:]}"
            # it died exactly at its kill point (each point kills once)
            assert sorted(os.listdir(markers)) == sorted(p.replace(":", "_") for p in KILLS[:attempt + 1])

            files = _rollout_files(runs / "killed")
            for name, fingerprint in seen.items():
                assert files.get(name) == fingerprint, f"attempt {attempt}: rollouts/{name} was lost or rewritten"
            seen.update(files)

            expected = _expected_task_states(attempt)
            states = _final_task_states(_flow_run_id(tag), expected)
            assert states == expected, f"attempt {attempt} (previous kill {KILLS[attempt - 1] if attempt else None})"

        # the stage killed at "end" was recovered from the state, every other one executed
        recovered = {n for n in TASK_NAMES if _stage_result(runs / "killed", n).get("recovered_from_state")}
        assert recovered == RECOVERED == {"log_stats[it=0]", "create_fine_tune_jobs[it=0]",
                                          "await_fine_tune_jobs[it=0]", "sample_rollouts[it=1]"}
        # a recovered stage still reports what it did (the flow summary lists jobs and tokens from it)
        killed_jobs = _stage_result(runs / "killed", "create_fine_tune_jobs[it=0]")["jobs"]
        assert set(killed_jobs) == {"prover", "verifier"} and all(j.startswith("ftjob-") for j in killed_jobs.values())
        assert set(_stage_result(runs / "killed", "await_fine_tune_jobs[it=0]")["trained_tokens"]) == \
            {"prover", "verifier"}

        # exactly one fine-tune job per (iteration, group), and the state uses their models
        client = server.client()
        for run_id in ("clean", "killed"):
            jobs = _jobs_of(client, run_id)
            keys = sorted((j.metadata["nipflow_iteration"], j.metadata["nipflow_group"]) for j in jobs)
            assert keys == [("0", "prover"), ("0", "verifier")], run_id
        jobs = _jobs_of(client, "killed")
        state = run_json(runs / "killed", "state.json")
        assert {g: s["fine_tuned_model_name"] for g, s in state["shared_model_groups"].items()} == \
            {j.metadata["nipflow_group"]: client.fine_tuning.jobs.retrieve(j.id).fine_tuned_model for j in jobs}
        for group in ("prover", "verifier"):  # the same fine-tune data as the clean run
            file_ids = [run_json(runs / r, f"fine_tune/iter_0_{group}.json")["file_id"]
                        for r in ("clean", "killed")]
            assert client.files.content(file_ids[0]).read() == client.files.content(file_ids[1]).read()

    assert set(seen) == {"0.json", "1.json", "test_1.json"}
    assert _rollout_files(runs / "clean")["0.json"][0] == seen["0.json"][0]
    assert state["iteration"] == 2 and state["train_loop_stage"] == "done"
    assert _comparable_state(runs / "killed") == _comparable_state(runs / "clean")

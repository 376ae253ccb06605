"""Faults on every endpoint of the API, and SIGKILLs at seeded moments, until a text run is done.

The local OpenAI-compatible server faults more than a fifth of *all* requests — files
(upload, list, retrieve), fine-tuning jobs (create, list, retrieve), chat completions and
models, GET and POST alike — seeded per endpoint group:

* 429, 500 and 503 without acting (``Retry-After`` set);
* the response lost after acting (a file stored, a job created, a completion computed);
* no response at once and the request acted on a second later, after the client gave up
  (a server still working on a request whose client timed out).

A 3-iteration pure-text EI run (``nipflow run ... --direct``, the real command line) is
SIGKILLed at seeded moments and started again until it is done (the kill sweep's
``Sweep``). An attempt may also give up on its own when the faults exhaust a request's
retries; then it must say so in one line (``nipflow: error: ...``), never with a traceback,
and it is started again. Checks (the kill sweep's): the state says done; exactly one
fine-tune job per (iteration, group, attempt) of the run's incarnation and no upload that no
job uses; one metrics line per (kind, iteration); rollout files never rewritten. Two seeds.
"""

from __future__ import annotations

import json

import pytest

from nipflow_llm_server.testing import local_api_server
from tests.e2e.test_kill_sweep import EI_PARAMS, Sweep, base_env, check_text_run, ei_direct_command

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ITERATIONS = 3
RATES = {"rate_429": 0.05, "rate_500": 0.04, "rate_503": 0.04, "rate_lose_response": 0.05, "rate_act_late": 0.04}
FAULTED = sum(RATES.values())  # 0.22 of every request, GET and POST, on every group


@pytest.mark.parametrize("seed", [3, 8])
def test_a_text_run_completes_exactly_once_through_faults_on_every_endpoint_and_kills(tmp_path, seed):
    params = {**EI_PARAMS, "rl": {**EI_PARAMS["rl"], "num_iterations": ITERATIONS}}
    params_file = tmp_path / "ei.json"
    params_file.write_text(json.dumps(params))
    faults = {"seed": seed, "endpoints": {"*": {**RATES, "act_late_s": 1.0, "retry_after_s": 0.02}}}
    with local_api_server(tmp_path / "api", job_time_scale=0.02, faults=faults) as server:
        env = {**base_env(tmp_path), "OPENAI_BASE_URL": server.base_url}
        runs = tmp_path / "runs"
        sweep = Sweep(ei_direct_command(runs, params_file), runs / "ei", env, kills=3, seed=seed, log_dir=tmp_path, may_give_up=True)
        kills = sweep.run()
        status = server.fault_status()
        injected = status["injected"]
        server.clear_faults()
        check_text_run(server, runs / "ei", iterations=ITERATIONS)
    faulted = {key.split(":", 1)[1] for key in injected}
    groups = {key.split(":", 1)[0] for key in injected}
    print(f"\nseed {seed}: {kills} kills, {len(sweep.gave_up)} attempts gave up {sweep.gave_up}; injected {injected}")
    assert kills >= 2
    assert {"chat.completions", "files", "fine_tuning.jobs", "models"} <= groups
    assert {"429", "500", "503", "lose_response", "act_late"} <= faulted
    faults = sum(n for key, n in injected.items() if not key.endswith(":slow"))
    assert faults >= 0.2 * sum(status["requests"].values()), (faults, status["requests"])

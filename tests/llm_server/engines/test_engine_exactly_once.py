"""The exactly-once guarantee of fine-tune job creation holds against the transformers
engine as against the selection engine: the job manager and the gateway's fault injection
do not depend on the engine."""

from __future__ import annotations

import pytest

from nip_core.agents.pure_text import PureTextSharedModelGroup
from nip_core.parameters import CodeValidationAgentParameters, HyperParameters
from nip_core.runs import RunStore
from tests.llm_server.engines.engine_helpers import clue_examples, wait_for_job

pytestmark = [pytest.mark.e2e]


def test_two_creates_of_one_intent_with_lost_responses_make_one_job(tiny_server, tiny_client, tmp_path):
    run = RunStore(str(tmp_path)).open_run(
        "tiny-once", HyperParameters(scenario="code_validation", trainer="pure_text_ei", dataset="test"))
    params = CodeValidationAgentParameters(model_name="nipflow-tiny-lm")
    examples = clue_examples(12, seed=9)
    tiny_server.set_faults({"seed": 5, "endpoints": {g: {"rate_lose_response": 0.5, "methods": ["POST"]}
                                                      for g in ("files", "fine_tuning.jobs")}})
    try:
        ids = [PureTextSharedModelGroup("verifier", ["verifier"], params, lambda: tiny_client)
               .create_job_from_examples(examples, run=run, run_id=run.run_id, iteration=0, seed=1)
               for _ in range(2)]
        injected = tiny_server.fault_status()["injected"]
    finally:
        tiny_server.clear_faults()
    assert sum(injected.values()) >= 1  # responses were really lost
    jobs = [j for j in tiny_client.fine_tuning.jobs.list(limit=100, metadata={"nipflow_run_id": run.run_id})
            if (j.metadata or {}).get("nipflow_incarnation") == run.incarnation]
    assert ids[0] == ids[1] and [j.id for j in jobs] == [ids[0]]
    job = wait_for_job(tiny_client, ids[0])
    assert job.status == "succeeded" and job.model == "nipflow-tiny-lm"
    assert job.fine_tuned_model.startswith("ft:nipflow-tiny-lm:org-local:")

"""Text agents and shared model groups against the local server: idempotent job creation."""

from __future__ import annotations

import pytest

from nip_core.agents.pure_text import (
    INSUFFICIENT_DATA_JOB_ID,
    FROZEN_JOB_ID,
    PureTextSharedModelGroup,
    PureTextWholeAgent,
)
from nipflow_llm_server.testing import local_api_server
from nip_core.parameters import CodeValidationAgentParameters, HyperParameters
from nip_core.runs import RunStore

pytestmark = [pytest.mark.e2e]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with local_api_server(tmp_path_factory.mktemp("api"), job_time_scale=0.02) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return server.client(max_retries=2, timeout=30.0)


@pytest.fixture
def run(tmp_path):
    hp = HyperParameters(scenario="code_validation", trainer="pure_text_ei", dataset="test")
    return RunStore(str(tmp_path)).open_run("idem", hp)


def examples(n=12):
    return [{"messages": [{"role": "system", "content": "Decision: accept"},
                          {"role": "user", "content": f"item {k}"},
                          {"role": "assistant", "content": "Decision: accept"}]} for k in range(n)]


def jobs_with(client, group, run_id):
    return [j for j in client.fine_tuning.jobs.list(limit=100).data
            if (j.metadata or {}).get("nipflow_group") == group and j.metadata.get("nipflow_run_id") == run_id]


def test_job_identity_and_record(client, run):
    """Exactly-once creation under lost responses is tested in tests/nip_core/agents/test_exactly_once.py."""
    params = CodeValidationAgentParameters(model_name="gpt-4o-mini")
    g = PureTextSharedModelGroup("verifier", ["verifier"], params, lambda: client)
    job_id = g.create_job_from_examples(examples(), run=run, run_id="idem", iteration=0, seed=5)
    record = run.read_json("fine_tune/iter_0_verifier.json")
    assert record["job_id"] == job_id and record["attempt"] == 1 and record["seed"] == 5
    assert record["filename"].startswith(f"nipflow-{run.incarnation}-it0-verifier-")
    job = client.fine_tuning.jobs.retrieve(job_id)
    assert job.metadata == {"nipflow_run_id": "idem", "nipflow_incarnation": run.incarnation,
                            "nipflow_iteration": "0", "nipflow_group": "verifier", "nipflow_attempt": "1"}
    assert job.training_file == record["file_id"] and len(job.user_provided_suffix) <= 64
    assert [j.id for j in jobs_with(client, "verifier", "idem")] == [job_id]


def test_the_jobs_epochs_are_the_apis_choice_or_the_runs(client, run):
    params = CodeValidationAgentParameters(model_name="gpt-4o-mini")
    auto = PureTextSharedModelGroup("prover", ["prover"], params, lambda: client)
    fixed = PureTextSharedModelGroup("verifier", ["verifier"], params, lambda: client, n_epochs=2)
    jobs = [client.fine_tuning.jobs.retrieve(g.create_job_from_examples(examples(), run=run, run_id="epochs",
                                                                        iteration=0, seed=5)) for g in (auto, fixed)]
    # 'auto' stays the API's until the job resolves it when it starts (as OpenAI shows it)
    assert [j.method.supervised.hyperparameters.n_epochs for j in jobs] == ["auto", 2]
    hp = HyperParameters(scenario="code_validation", trainer="pure_text_ei", dataset="test",
                         text_rl={"fine_tune_n_epochs": 1})
    from nip_core.scenarios.registry import build_scenario_instance
    from nip_core.settings import ExperimentSettings

    built = build_scenario_instance(hp, ExperimentSettings(use_wandb=False, openai_base_url=str(client.base_url)))
    assert {g.n_epochs for g in built.shared_model_groups.values()} == {1}


def test_insufficient_data_and_frozen_create_no_job(client, run):
    params = CodeValidationAgentParameters(model_name="gpt-4o-mini")
    g = PureTextSharedModelGroup("prover", ["prover"], params, lambda: client)
    assert g.create_job_from_examples(examples(9), run=run, run_id="idem", iteration=3) == INSUFFICIENT_DATA_JOB_ID
    assert g.get_fine_tune_job_status() == "succeeded"
    g.switch_to_next_model()
    assert g.model_name == "gpt-4o-mini"
    frozen = PureTextSharedModelGroup("p2", ["p2"], params.model_copy(update={"freeze_agent": True}), lambda: client)
    assert frozen.create_job_from_examples(examples(), run=run, run_id="idem", iteration=3) == FROZEN_JOB_ID
    assert jobs_with(client, "prover", "idem") == [] and jobs_with(client, "p2", "idem") == []


def test_agent_counts_tokens_and_uses_the_group_model(client):
    params = CodeValidationAgentParameters(model_name="gpt-4o-mini", max_response_words=20)
    agent = PureTextWholeAgent("verifier", params, lambda: client, lambda: "gpt-4o-mini")
    text, finish, tokens = agent.generate([{"role": "system", "content": "Reply:\nDecision: accept\nDecision: reject"}],
                                          seed=3)
    assert text in ("Decision: accept", "Decision: reject") and finish == "stop" and tokens > 0

"""Fine-tune files and jobs are created exactly once per intent, whatever response is lost.

The local server's ``rate_lose_response`` fault acts on a request in full and then drops
the response, as a proxy or a flaky network does after the server created the object.
"""

from __future__ import annotations

import shutil
import time
from types import SimpleNamespace

import openai
import pytest

from nip_core.agents.pure_text import PureTextSharedModelGroup
from nip_core.llm.job_status import TERMINAL_STATUSES
from nip_core.errors import FineTuneJobFailed
from nipflow_llm_server.testing import local_api_server
from nip_core.parameters import CodeValidationAgentParameters, HyperParameters
from nip_core.runs import RunStore

pytestmark = [pytest.mark.e2e]

PARAMS = CodeValidationAgentParameters(model_name="gpt-4o-mini")


def lose_posts(rate: float, seed: int = 11, groups=("files", "fine_tuning.jobs")) -> dict:
    return {"seed": seed, "endpoints": {g: {"rate_lose_response": rate, "methods": ["POST"]} for g in groups}}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with local_api_server(tmp_path_factory.mktemp("api"), job_time_scale=0.02) as s:
        yield s


@pytest.fixture
def client(server):
    server.clear_faults()
    yield server.client(max_retries=2, timeout=30.0)
    server.clear_faults()


def new_run(tmp_path, run_id="exact"):
    hp = HyperParameters(scenario="code_validation", trainer="pure_text_ei", dataset="test")
    return RunStore(str(tmp_path)).open_run(run_id, hp)


def examples(n=12, tag=""):
    return [{"messages": [{"role": "system", "content": "Decision: accept"},
                          {"role": "user", "content": f"item {tag}{k}"},
                          {"role": "assistant", "content": "Decision: accept"}]} for k in range(n)]


def jobs_of(client, run) -> list:
    return [j for j in client.fine_tuning.jobs.list(limit=100, metadata={"nipflow_run_id": run.run_id})
            if (j.metadata or {}).get("nipflow_incarnation") == run.incarnation]


def files_of(client, run) -> list:
    return [f for f in client.files.list() if f.filename.startswith(f"nipflow-{run.incarnation}-")]


def test_the_official_clients_own_retries_duplicate_a_job_whose_response_is_lost(server, client):
    """The failure this module guards against (control: the fault is real)."""
    f = client.files.create(file=("control.jsonl", b"".join(
        (__import__("json").dumps(e) + "\n").encode() for e in examples())), purpose="fine-tune")
    server.set_faults(lose_posts(1.0, groups=("fine_tuning.jobs",)))
    with pytest.raises(openai.APIConnectionError):
        client.fine_tuning.jobs.create(model="gpt-4o-mini", training_file=f.id, metadata={"control": "dup"})
    server.clear_faults()
    dupes = [j for j in client.fine_tuning.jobs.list(limit=100, metadata={"control": "dup"})]
    assert len(dupes) == 3  # the first send and the client's two retries: three billed jobs


def test_lost_responses_on_uploads_and_creates_leave_one_job_per_intent_and_no_orphan_file(server, client, tmp_path):
    run = new_run(tmp_path)
    server.set_faults(lose_posts(0.5))
    created = {}
    for iteration in range(6):
        for group in ("prover", "verifier"):
            g = PureTextSharedModelGroup(group, [group], PARAMS, lambda: client)
            created[(iteration, group)] = g.create_job_from_examples(
                examples(tag=f"{iteration}{group}"), run=run, run_id=run.run_id, iteration=iteration, seed=iteration)
    injected = server.fault_status()["injected"]
    server.clear_faults()
    assert injected.get("files:lose_response", 0) >= 3 and injected.get("fine_tuning.jobs:lose_response", 0) >= 3
    jobs = jobs_of(client, run)
    intents = [(int(j.metadata["nipflow_iteration"]), j.metadata["nipflow_group"]) for j in jobs]
    assert sorted(intents) == sorted(created) and len(jobs) == 12  # exactly one job per (iteration, group)
    assert {(int(j.metadata["nipflow_iteration"]), j.metadata["nipflow_group"]): j.id for j in jobs} == created
    files = files_of(client, run)
    assert sorted(f.id for f in files) == sorted(j.training_file for j in jobs)  # every upload is used, once
    for (iteration, group), job_id in created.items():
        record = run.read_json(f"fine_tune/iter_{iteration}_{group}.json")
        assert record["job_id"] == job_id and record["attempt"] == 1


def test_a_resumed_process_adopts_instead_of_creating_and_a_new_incarnation_does_not(server, client, tmp_path):
    run = new_run(tmp_path)
    first = PureTextSharedModelGroup("verifier", ["verifier"], PARAMS, lambda: client)
    job_id = first.create_job_from_examples(examples(), run=run, run_id=run.run_id, iteration=0)
    run.storage.remove("fine_tune/iter_0_verifier.json")  # died before recording anything
    again = PureTextSharedModelGroup("verifier", ["verifier"], PARAMS, lambda: client)
    assert again.create_job_from_examples(examples(), run=run, run_id=run.run_id, iteration=0) == job_id
    assert len(jobs_of(client, run)) == 1 and len(files_of(client, run)) == 1
    old_incarnation = run.incarnation
    shutil.rmtree(tmp_path / "exact")  # the user deletes the run and starts the same run id again
    reborn = new_run(tmp_path)
    assert reborn.incarnation != old_incarnation
    fresh = PureTextSharedModelGroup("verifier", ["verifier"], PARAMS, lambda: client)
    new_id = fresh.create_job_from_examples(examples(), run=reborn, run_id=reborn.run_id, iteration=0)
    assert new_id != job_id
    assert client.fine_tuning.jobs.retrieve(new_id).metadata["nipflow_incarnation"] == reborn.incarnation


def _wait_terminal(group) -> str:
    import time

    deadline = time.monotonic() + 60
    while (status := group.get_fine_tune_job_status()) not in TERMINAL_STATUSES:
        assert time.monotonic() < deadline, f"job still {status}"
        time.sleep(0.05)
    return status


def test_failed_jobs_get_new_attempts_until_the_limit_then_every_error_is_listed(client, tmp_path):
    run = new_run(tmp_path)
    # SFT chats sent as a DPO job fail validation on the server: a job that really fails
    g = PureTextSharedModelGroup("prover", ["prover"], PARAMS, lambda: client, max_attempts=3)
    first = g.create_job_from_examples(examples(), "dpo", run=run, run_id=run.run_id, iteration=2)
    ids = [first]
    for attempt in (2, 3):
        assert _wait_terminal(g) == "failed"
        ids.append(g.retry_failed_job(run=run, run_id=run.run_id, iteration=2))
        assert g.state.fine_tune_attempt == attempt
        # a process that restarts here adopts the newest attempt, it does not start over
        resumed = PureTextSharedModelGroup("prover", ["prover"], PARAMS, lambda: client, max_attempts=3)
        assert resumed.create_job_from_examples(examples(), "dpo", run=run, run_id=run.run_id, iteration=2) == ids[-1]
        assert resumed.state.fine_tune_attempt == attempt
    assert _wait_terminal(g) == "failed"
    with pytest.raises(FineTuneJobFailed) as info:
        g.retry_failed_job(run=run, run_id=run.run_id, iteration=2)
    message = str(info.value)
    assert "3 attempt(s) of 3" in message and all(f"attempt {a} ({ids[a - 1]}) failed" in message for a in (1, 2, 3))
    jobs = jobs_of(client, run)
    assert sorted(j.metadata["nipflow_attempt"] for j in jobs) == ["1", "2", "3"]
    assert len({j.training_file for j in jobs}) == 1  # the same upload for every attempt
    assert [a["job_id"] for a in run.read_json("fine_tune/iter_2_prover.json")["attempts"]] == ids


def test_a_cancelled_job_is_retried(client, tmp_path):
    run = new_run(tmp_path)
    g = PureTextSharedModelGroup("verifier", ["verifier"], PARAMS, lambda: client, max_attempts=2)
    job_id = g.create_job_from_examples(examples(), run=run, run_id=run.run_id, iteration=0)
    client.fine_tuning.jobs.cancel(job_id)
    assert _wait_terminal(g) == "cancelled"
    second = g.retry_failed_job(run=run, run_id=run.run_id, iteration=0)
    assert second != job_id and _wait_terminal(g) == "succeeded"
    g.switch_to_next_model()
    assert g.model_name.startswith("ft:gpt-4o-mini")


@pytest.mark.parametrize("status", ["paused", "a_status_from_the_future"])
def test_paused_and_unknown_statuses_are_waited_on(status):
    job = SimpleNamespace(status=status)
    fake = SimpleNamespace(fine_tuning=SimpleNamespace(jobs=SimpleNamespace(retrieve=lambda job_id: job)))
    g = PureTextSharedModelGroup("prover", ["prover"], PARAMS, lambda: fake)
    g.state.fine_tune_job_id = "ftjob-x"
    assert g.get_fine_tune_job_status() == status
    assert status not in TERMINAL_STATUSES


class FilterIgnoringClient:
    """The real client, but ``jobs.list`` drops the metadata filter (a server that ignores it)."""

    def __init__(self, client):
        self._client = client
        jobs = client.fine_tuning.jobs
        self.fine_tuning = SimpleNamespace(jobs=SimpleNamespace(
            list=lambda metadata=None, **kw: jobs.list(**kw), create=jobs.create, retrieve=jobs.retrieve))


def test_job_lookup_pages_through_every_job_and_checks_metadata_itself(client, tmp_path):
    from nip_core.llm.remote_objects import find_jobs

    run = new_run(tmp_path)
    ids = {}
    for iteration in range(5):
        g = PureTextSharedModelGroup("prover", ["prover"], PARAMS, lambda: client)
        ids[iteration] = g.create_job_from_examples(examples(tag=str(iteration)), run=run,
                                                           run_id=run.run_id, iteration=iteration)
    wanted = PureTextSharedModelGroup("prover", ["prover"], PARAMS, lambda: client).job_metadata(
        run, run.run_id, 0, 1)  # the oldest job: on the last page, newest first
    assert [j.id for j in find_jobs(client, wanted, page_size=2)] == [ids[0]]
    loose = FilterIgnoringClient(client)
    assert [j.id for j in find_jobs(loose, wanted, page_size=2)] == [ids[0]]


def act_late(posts_of: str, after_s: float, seed: int = 5) -> dict:
    return {"seed": seed, "endpoints": {posts_of: {"rate_act_late": 1.0, "act_late_s": after_s, "methods": ["POST"]}}}


def test_a_job_the_server_creates_only_after_the_response_was_lost_is_found_not_created_again(
        server, client, tmp_path, monkeypatch):
    """The server drops the connection and creates the job 1.5 s later (a create that timed out
    while the server kept working): the look-ups of the settle window find it. Before the
    settle window the one look-up 0.25 s later missed it and a second job was created."""
    monkeypatch.setenv("NIPFLOW_CREATE_SETTLE_S", "10")
    run = new_run(tmp_path)
    g = PureTextSharedModelGroup("verifier", ["verifier"], PARAMS, lambda: client)
    g.create_job_from_examples(examples(), run=run, run_id=run.run_id, iteration=0)  # the upload, clean
    jobs_before = len(jobs_of(client, run))
    server.set_faults(act_late("fine_tuning.jobs", 1.5))
    late = PureTextSharedModelGroup("prover", ["prover"], PARAMS, lambda: client)
    job_id = late.create_job_from_examples(examples(tag="late"), run=run, run_id=run.run_id, iteration=0)
    assert server.fault_status()["injected"] == {"fine_tuning.jobs:act_late": 1}
    server.clear_faults()
    time.sleep(2.0)  # a second job, had one been sent, would be listed by now
    provers = [j for j in jobs_of(client, run) if j.metadata["nipflow_group"] == "prover"]
    assert [j.id for j in provers] == [job_id] and len(jobs_of(client, run)) == jobs_before + 1


def test_a_job_never_created_is_created_again_once_the_settle_window_has_passed(server, client, tmp_path, monkeypatch):
    monkeypatch.setenv("NIPFLOW_CREATE_SETTLE_S", "1")
    run = new_run(tmp_path)
    server.set_faults({"seed": 2, "endpoints": {"fine_tuning.jobs": {"rate_500": 0.5, "methods": ["POST"],
                                                                     "retry_after_s": 0}}})
    g = PureTextSharedModelGroup("prover", ["prover"], PARAMS, lambda: client)
    started = time.monotonic()
    job_id = g.create_job_from_examples(examples(), run=run, run_id=run.run_id, iteration=1)
    waited = time.monotonic() - started
    failed = server.fault_status()["injected"].get("fine_tuning.jobs:500", 0)
    server.clear_faults()
    assert [j.id for j in jobs_of(client, run)] == [job_id]
    assert failed >= 1 and waited >= failed * 1.0  # each 500 was looked up for the window first


@pytest.fixture
def slow_jobs_client(tmp_path):
    """A server whose jobs run for a while (so that a duplicate is still running when found)."""
    with local_api_server(tmp_path / "slow", job_time_scale=1.0) as s:
        yield s.client(max_retries=2, timeout=30.0)


def test_duplicates_of_one_intent_follow_one_rule_oldest_of_the_last_attempt_the_rest_cancelled(slow_jobs_client,
                                                                                               tmp_path):
    client = slow_jobs_client
    run = new_run(tmp_path)
    g = PureTextSharedModelGroup("verifier", ["verifier"], PARAMS, lambda: client)
    first = g.create_job_from_examples(examples(), run=run, run_id=run.run_id, iteration=3)
    record = run.read_json("fine_tune/iter_3_verifier.json")
    metadata = g.job_metadata(run, run.run_id, 3, 1)
    # two more jobs with the same intent, as a server that acted on one request three times leaves
    extra = [client.fine_tuning.jobs.create(model="gpt-4o-mini", training_file=record["file_id"],
                                            metadata=metadata).id for _ in range(2)]
    run.storage.remove("fine_tune/iter_3_verifier.json")  # a restarted process, nothing recorded
    again = PureTextSharedModelGroup("verifier", ["verifier"], PARAMS, lambda: client)
    assert again.create_job_from_examples(examples(), run=run, run_id=run.run_id, iteration=3) == first
    assert run.read_json("fine_tune/iter_3_verifier.json")["cancelled_duplicates"] == sorted(extra)
    statuses = {j.id: j.status for j in jobs_of(client, run)}
    assert statuses[first] != "cancelled" and all(statuses[i] == "cancelled" for i in extra)
    # the exactly-once path itself (a retried attempt's look-up) applies the same rule
    from nip_core.llm.remote_objects import create_job_once

    job, created, cancelled = create_job_once(client, metadata, model="gpt-4o-mini", training_file=record["file_id"])
    assert (job.id, created, cancelled) == (first, False, [])  # the cancelled ones are listed, not chosen again


@pytest.mark.parametrize("raw, expected", [(None, 30.0), ("", 30.0), ("2.5", 2.5), ("0", 0.0)])
def test_the_settle_window_comes_from_the_environment(monkeypatch, raw, expected):
    from nip_core.llm.remote_objects import SETTLE_ENV, settle_seconds

    if raw is None:
        monkeypatch.delenv(SETTLE_ENV, raising=False)
    else:
        monkeypatch.setenv(SETTLE_ENV, raw)
    assert settle_seconds() == expected


@pytest.mark.parametrize("raw", ["-1", "soon", "inf", "nan"])
def test_a_bad_settle_window_is_refused_naming_the_variable(monkeypatch, raw):
    from nip_core.llm.remote_objects import SETTLE_ENV, settle_seconds

    monkeypatch.setenv(SETTLE_ENV, raw)
    with pytest.raises(ValueError, match=r"\$NIPFLOW_CREATE_SETTLE_S="):
        settle_seconds()

"""SQLite store pagination, the recovery of unfinished jobs after a restart, and model loading."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from nipflow_llm_server.engines.selection import SelectionEngine
from nipflow_llm_server.server.config import ServerConfig
from nipflow_llm_server.server.files import FileService
from nipflow_llm_server.server.jobs import JobManager
from nipflow_llm_server.server.records import JobRecord, now
from nipflow_llm_server.server.registry import ModelRegistry
from nipflow_llm_server.server.store import Store, UnknownCursorError


def _job(i: int, status: str = "queued", metadata=None) -> JobRecord:
    return JobRecord(
        id=f"ftjob-{i:024d}", created_at=now(), hyperparameters={}, model="gpt-4o-mini", organization_id="org-local",
        seed=i, status=status, training_file="file-x", method={"type": "supervised"}, metadata=metadata,
    )


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "state.sqlite3")
    yield s
    s.close()


def test_jobs_page_newest_first_with_cursor_and_filter(store):
    for i in range(5):
        store.add_job(_job(i, metadata={"group": "a" if i % 2 else "b"}))
    page, more = store.list_jobs(None, 2)
    assert [j.seed for j in page] == [4, 3] and more
    page, more = store.list_jobs(page[-1].id, 2)
    assert [j.seed for j in page] == [2, 1] and more
    page, more = store.list_jobs(page[-1].id, 2)
    assert [j.seed for j in page] == [0] and not more
    page, more = store.list_jobs(None, 10, keep=lambda j: j.metadata["group"] == "a")
    assert [j.seed for j in page] == [3, 1] and not more
    with pytest.raises(UnknownCursorError):
        store.list_jobs("ftjob-nope", 2)


def test_records_survive_reopening(tmp_path):
    first = Store(tmp_path / "db")
    first.add_job(_job(1, "running"))
    first.add_attempt("ftjob-" + "1".rjust(24, "0"))
    first.close()
    second = Store(tmp_path / "db")
    (job,) = second.jobs_with_status(("running",))
    assert job.seed == 1 and second.job_attempts(job.id) == 1
    second.close()


def test_recovery_resumes_or_fails_every_unfinished_job(tmp_path, store):
    config = ServerConfig(data_dir=tmp_path, max_job_attempts=2)
    manager = JobManager(config, store, FileService(store, tmp_path), ModelRegistry(store, tmp_path))
    jobs = {name: _job(i, status) for i, (name, status) in enumerate(
        [("resume", "running"), ("exhausted", "running"), ("queued", "queued"), ("cancel", "validating_files"), ("done", "succeeded")]
    )}
    for job in jobs.values():
        store.add_job(job)
    store.add_attempt(jobs["resume"].id)
    for _ in range(2):
        store.add_attempt(jobs["exhausted"].id)
    store.request_cancel(jobs["cancel"].id)

    manager.recover()

    status = {name: store.get_job(job.id).status for name, job in jobs.items()}
    assert status == {"resume": "running", "exhausted": "failed", "queued": "queued", "cancel": "cancelled", "done": "succeeded"}
    failed = store.get_job(jobs["exhausted"].id)
    assert failed.error.code == "server_error" and "stopped 2 times" in failed.error.message
    (event,), _ = store.list_events(jobs["resume"].id, None, 10)
    assert event.level == "warn" and "attempt 2 of 2" in event.message
    queued = [manager._queue.get_nowait() for _ in range(manager._queue.qsize())]
    assert queued == [jobs["resume"].id, jobs["queued"].id]


def test_concurrent_first_requests_load_a_model_once_and_share_it(tmp_path, store):
    loads, inside, most_inside = [], [0], [0]
    guard = threading.Lock()

    class SlowLoading(SelectionEngine):
        def load_base(self, name):
            with guard:
                loads.append(name)
                inside[0] += 1
                most_inside[0] = max(most_inside[0], inside[0])
            time.sleep(0.3)  # a real model takes seconds: the other requests arrive meanwhile
            with guard:
                inside[0] -= 1
            return super().load_base(name)

    registry = ModelRegistry(store, tmp_path, SlowLoading())
    names = ["gpt-4o-mini"] * 4 + ["gpt-4.1-mini"] * 4
    with ThreadPoolExecutor(8) as pool:
        models = list(pool.map(registry.get, names))
    assert sorted(loads) == ["gpt-4.1-mini", "gpt-4o-mini"]  # each loaded once
    assert all(m is models[0] for m in models[:4]) and all(m is models[4] for m in models[4:])
    assert most_inside[0] == 2  # two different models still load side by side
    assert registry.get("gpt-4o-mini") is models[0] and len(loads) == 2  # then from the cache

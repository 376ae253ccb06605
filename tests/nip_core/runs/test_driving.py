"""The one run driver (issue #25 item 1): lease, state reload and invocation record, for
``nipflow run --direct`` and every flow run alike (``nip_core/runs/driving.py``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from nip_core.errors import RunLockedError
from nip_core.parameters import HyperParameters
from nip_core.runs import RunStore
from nip_core.runs.driving import driving_run
from nip_core.runs.lock import RunLock
from nip_core.runs.null import NullRun


def _trainer(tmp_path, run_id="r"):
    hp = HyperParameters(scenario="graph_isomorphism", trainer="vanilla_ppo", dataset="test")
    run = RunStore(str(tmp_path)).open_run(run_id, hp)
    events = []
    return SimpleNamespace(run=run, reload_state=lambda: events.append("reload")), events


def _invocations(run):
    return [{k: v for k, v in i.items() if k not in ("started", "ended")} for i in run.metadata()["invocations"]]


def test_a_driver_takes_the_lease_reloads_the_state_and_records_how_it_ended(tmp_path):
    trainer, events = _trainer(tmp_path)
    ended_before_after = []
    with driving_run(trainer, "direct", after=lambda: ended_before_after.append(
            _invocations(trainer.run)[-1].get("status"))) as lock:
        assert lock.held and events == ["reload"]
        assert _invocations(trainer.run) == [{"driver": "direct"}]
    assert not trainer.run.lock.held
    assert _invocations(trainer.run) == [{"driver": "direct", "status": "completed"}]
    assert ended_before_after == ["completed"]  # `after` (the result card) sees the end recorded

    with pytest.raises(ValueError, match="boom"):
        with driving_run(trainer, "flow", details={"flow_run_id": "fr-1"}):
            raise ValueError("boom")
    assert _invocations(trainer.run)[-1] == {"driver": "flow", "flow_run_id": "fr-1", "status": "failed",
                                             "message": "ValueError: boom"}
    assert not trainer.run.lock.held


def test_an_interrupt_is_recorded_with_the_callers_reading_of_it(tmp_path):
    trainer, _ = _trainer(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        with driving_run(trainer, "direct", outcome_of=lambda e: ("interrupted", "stopped by SIGHUP")):
            raise KeyboardInterrupt
    assert _invocations(trainer.run)[-1] == {"driver": "direct", "status": "interrupted",
                                             "message": "stopped by SIGHUP"}


def test_a_nested_driver_re_enters_and_a_block_joins_without_a_record(tmp_path):
    trainer, events = _trainer(tmp_path)
    with driving_run(trainer, "flow") as lock:
        with driving_run(trainer):  # a local subflow: same process, same lease
            assert lock.held
        assert lock.held and events == ["reload"]  # re-entering reloads nothing and keeps the lease
        block, block_events = _trainer(tmp_path)  # an RL block's own trainer, under the parent's claim
        with driving_run(block, claim=lock.claim()) as joined:
            assert joined.generation == lock.generation and block_events == ["reload"]
    assert [i["driver"] for i in _invocations(trainer.run)] == ["flow"]


def test_another_live_driver_is_refused_before_anything_is_recorded(tmp_path):
    trainer, events = _trainer(tmp_path)
    other = RunLock(trainer.run.storage, "r", ttl_s=30)
    other.acquire()
    try:
        trainer.run.lock.ttl_s = 0.2  # waits 1.5 ttl for the other driver
        with pytest.raises(RunLockedError):
            with driving_run(trainer, "direct"):
                raise AssertionError("not reached")
    finally:
        other.release()
    assert events == [] and "invocations" not in trainer.run.metadata()


def test_a_run_that_is_not_stored_has_no_lease_and_no_record():
    after = []
    with driving_run(SimpleNamespace(run=NullRun("x")), "direct", after=lambda: after.append(1)) as lock:
        assert lock is None
    assert after == [1]

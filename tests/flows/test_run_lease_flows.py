"""Flow runs drive a run only while they hold its lease; RL blocks join their parent's claim."""

from __future__ import annotations

import pytest

from nip_core.errors import RunLockedError
from nip_core.runs import RunStore
from nip_core.runs.lease import LeaseLostError
from nip_core.runs.lock import RunLock


def _params(tmp_path, run_id):
    from flows.parameters import ExperimentParameters

    return ExperimentParameters(scenario="graph_isomorphism", trainer="vanilla_ppo", run_id=run_id,
                                runs_dir=str(tmp_path / "runs"), overrides=["rl.num_iterations=4"], block_size=2)


def test_a_flow_run_holds_the_lease_while_it_trains_and_gives_it_back(fakes, tmp_path, monkeypatch):
    from flows.experiment import train_experiment

    storage = RunStore(str(tmp_path / "runs")).run_storage("leased")
    seen = []
    record = fakes.record

    def record_and_compete(run, **event):
        record(run, **event)
        if event["event"] == "start":
            view = RunLock(storage, "leased").view()
            with pytest.raises(RunLockedError):  # a second driver (e.g. `nipflow resume --direct`)
                RunLock(storage, "leased").acquire(wait_s=0.2)
            seen.append(view.generation)

    monkeypatch.setattr(fakes, "record", record_and_compete)
    state = train_experiment(**_params(tmp_path, "leased").flow_parameters(), return_state=True)
    assert state.is_completed()
    assert seen == [1, 1]  # both blocks ran under the experiment's one claim
    assert RunLock(storage, "leased").view().owner is None  # released at the end


@pytest.mark.slow
def test_a_flow_run_does_not_drive_a_run_another_driver_holds(fakes, tmp_path):
    from flows.experiment import train_experiment

    storage = RunStore(str(tmp_path / "runs")).run_storage("busy")
    holder = RunLock(storage, "busy", ttl_s=2.0).acquire()  # renewed by its thread: never expires
    try:
        state = train_experiment(**_params(tmp_path, "busy").flow_parameters(), return_state=True)
        assert state.is_failed()
        with pytest.raises(RunLockedError, match="busy"):
            state.result()
        assert fakes.executions(storage.full("")) == []  # nothing was trained
    finally:
        holder.release()


def test_a_child_joins_only_the_current_claim(fakes, tmp_path):
    from flows.leases import driving
    from nip_core.trainers import build_trainer

    parameters = _params(tmp_path, "child")
    hp = parameters.hyper_params()
    parent = build_trainer(hp, parameters.settings(hp))
    with driving(parent) as lock:
        claim = lock.claim()
        child = build_trainer(hp, parameters.settings(hp))
        with driving(child, claim):
            assert child.run.lock.held and child.run.lock.generation == claim["generation"]
        assert lock.held  # the child's exit does not give the parent's claim back
        stale = build_trainer(hp, parameters.settings(hp))
        with pytest.raises(LeaseLostError):
            with driving(stale, {**claim, "generation": claim["generation"] + 1}):
                pass


@pytest.mark.slow
def test_a_flow_run_that_runs_again_waits_for_its_earlier_attempts_claim(fakes, tmp_path, monkeypatch):
    """A rescheduled flow run (same id) finds its earlier attempt's claim still renewed (by a
    block that attempt started, which joined it): it waits for that claim to end instead of
    failing with RunLockedError after 1.5 ttl; another driver's claim still refuses it."""
    import threading
    import time

    import prefect.runtime.flow_run as flow_run_runtime

    from flows.leases import driving
    from nip_core.trainers import build_trainer

    monkeypatch.setattr(flow_run_runtime, "id", "flow-run-1")  # what prefect.runtime says inside that flow run
    parameters = _params(tmp_path, "again")
    hp = parameters.hyper_params()
    storage = RunStore(str(tmp_path / "runs")).run_storage("again")
    # ttl 4 s: renewed every 1.3 s by its thread (as a joined block renews it), with room for a
    # renewal starved of CPU on a loaded machine
    earlier = RunLock(storage, "again", ttl_s=4.0)
    earlier.describe["flow_run_id"] = "flow-run-1"
    earlier.acquire()
    threading.Timer(4.0, earlier.stop_renewing).start()  # the block ends; the claim lapses within 4 s
    trainer = build_trainer(hp, parameters.settings(hp))
    trainer.run.lock.ttl_s = 1.5
    started = time.monotonic()
    with driving(trainer) as lock:
        waited = time.monotonic() - started
        assert lock.held and lock.generation == earlier.generation + 1
        assert lock.view().holder["flow_run_id"] == "flow-run-1"
    assert 4.0 <= waited < 4.0 + 4.0 * 2  # past its 1.5 ttl (2.25 s): it waited for the claim, not a deadline

    # Another driver's claim, renewed with a ttl long enough that a renewal starved of CPU on
    # a loaded machine still lands in its window; the newcomer gives up after 1.5 of its own ttl.
    other = RunLock(storage, "again", ttl_s=30.0)
    other.describe["flow_run_id"] = "another-flow-run"
    other.acquire()
    newcomer = build_trainer(hp, parameters.settings(hp))
    newcomer.run.lock.ttl_s = 1.5
    try:
        with pytest.raises(RunLockedError):
            with driving(newcomer):
                pass
        assert other.held and other.view().holder["flow_run_id"] == "another-flow-run"
    finally:
        other.release()

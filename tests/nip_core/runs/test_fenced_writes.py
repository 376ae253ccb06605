"""A driver that lost the run's lease while paused changes nothing readers see (docs/architecture.md).

Two drivers of one run on one store, in one process: ``old`` takes the lease and stops
renewing it (a process paused by SIGSTOP, a GC or swap pause, a closed laptop lid), ``new``
takes the run over once the claim expired. Then ``old`` does what a driver paused *between*
its lease check and its write does when it wakes: the write itself, with the check already
behind it (its ``check_lease`` passes once, as it did before the pause, and is real
afterwards). Whatever the write kind, the new driver and any fresh reader see exactly what
the new driver wrote. Local disk and S3 (moto) alike.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid

import pytest

from nip_core.errors import WriteOnceConflictError
from nip_core.parameters import HyperParameters
from nip_core.runs import fencing
from nip_core.runs.lease import LeaseLostError
from nip_core.runs.store import RunStore
from nip_core.trainers.base import TrainerState
from nip_core.trainers.warm_start import prepare_warm_start

TTL_S = 2.0  # long enough for renewals on a busy 2-core machine


def _params() -> HyperParameters:
    return HyperParameters.from_dict({"scenario": "graph_isomorphism", "trainer": "vanilla_ppo", "dataset": "test"})


_DRIVERS: list = []


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    """A run store on local disk and on S3."""
    yield from _stores(request, tmp_path)


@pytest.fixture(params=["local"])
def local_store(request, tmp_path):
    """A run store on local disk only (for what does not depend on the backend's conditional create)."""
    yield from _stores(request, tmp_path)


def _stores(request, tmp_path):
    if request.param == "local":
        yield RunStore(str(tmp_path / "runs"))
    else:
        endpoint = request.getfixturevalue("s3_endpoint")
        yield RunStore(f"s3://{endpoint.bucket}/fenced-{uuid.uuid4().hex[:8]}")
    while _DRIVERS:
        _DRIVERS.pop().lock.stop_renewing()


def _driver(store: RunStore, run_id: str):
    run = store.open_run(run_id)
    run.lock.ttl_s = TTL_S
    run.lock.acquire(wait_s=10 * TTL_S, poll_s=0.05)
    _DRIVERS.append(run)
    return run


def _pause(run) -> None:
    """The driver stops renewing, as a paused process does; its claim expires meanwhile."""
    run.lock.stop_renewing()


def _checked_before_the_pause(run) -> None:
    """The driver's next lease check already happened (before the pause); later ones are real."""
    real = run.check_lease
    calls = []

    def check() -> None:
        calls.append(1)
        if len(calls) > 1:
            real()

    run.check_lease = check


def _take_over(store: RunStore, old) -> object:
    _pause(old)
    time.sleep(TTL_S * 1.1)
    new = _driver(store, old.run_id)
    assert new.lock.generation == old.lock.generation + 1 and new.lock.epoch == new.lock.generation
    return new


def _snapshot(store: RunStore, run_id: str) -> dict[str, str]:
    """What a fresh reader sees: every logical file of the run, hashed."""
    reader = store.open_run(run_id)
    seen = {}
    for rel in fencing.present(reader.storage):
        seen[rel] = hashlib.sha256(reader.storage.read_bytes(reader.stored_name(rel))).hexdigest()
    for directory in ("checkpoints", "stages", "rollouts", "warm_start"):
        for name in reader.storage.listdir(directory):
            seen[f"{directory}/{name}"] = hashlib.sha256(reader.storage.read_bytes(f"{directory}/{name}")).hexdigest()
    return seen


def _new_run(store: RunStore) -> str:
    run_id = f"r{uuid.uuid4().hex[:6]}"
    store.open_run(run_id, _params())
    return run_id


def test_state_metadata_metrics_and_records_of_a_woken_driver_are_never_read(store):
    run_id = _new_run(store)
    old = _driver(store, run_id)
    old.save_state(TrainerState(iteration=37))
    old.append_metrics(36, {"loss": 1.0})
    old.write_json("fine_tune/iter_1_prover.json", {"job_id": "ftjob-old"})
    old.write_json("orchestration/suspensions.json", {"a": 1})
    new = _take_over(store, old)
    assert new.load_state(TrainerState).iteration == 37  # sealed: what the old driver had written
    new.save_state(TrainerState(iteration=38))
    new.append_metrics(37, {"loss": 0.5})
    new.write_json("fine_tune/iter_1_prover.json", {"job_id": "ftjob-new"})
    before = _snapshot(store, run_id)

    # each of these is the one write a driver paused after its lease check makes when it wakes
    old.write_json("state.json", {"iteration": 99})  # save_state's write, its check behind it
    old.append_metrics(37, {"loss": 9.0})
    old.append_metrics(38, {"loss": 9.0})
    old.write_json("fine_tune/iter_1_prover.json", {"job_id": "ftjob-stale"})
    old.write_json("orchestration/suspensions.json", {"a": 2})
    old.update_metadata(stale=True)

    assert _snapshot(store, run_id) == before
    for reader in (new, store.open_run(run_id)):
        assert reader.load_state(TrainerState).iteration == 38
        assert [(r["iteration"], r["loss"]) for r in reader.read_metrics()] == [(36, 1.0), (37, 0.5)]
        assert reader.read_json("fine_tune/iter_1_prover.json") == {"job_id": "ftjob-new"}
        assert reader.read_json("orchestration/suspensions.json") == {"a": 1}
        assert "stale" not in reader.metadata()
    # the new driver's files carry its epoch; the run's files keep their plain names for readers
    assert new.stored_name("state.json") == fencing.tagged("state.json", new.lock.epoch)
    assert new.list_files("fine_tune") == ["iter_1_prover.json"]
    # and the woken driver stops at its next check
    with pytest.raises(LeaseLostError, match="lost"):
        old.save_state(TrainerState(iteration=100))


def test_a_woken_driver_writing_before_the_new_one_wrote_anything_is_not_read_either(store):
    """The seal before the takeover hides later writes of the old driver to files the new one has not touched."""
    run_id = _new_run(store)
    old = _driver(store, run_id)
    old.save_state(TrainerState(iteration=5))
    old.append_metrics(4, {"loss": 1.0})
    new = _take_over(store, old)
    before = _snapshot(store, run_id)
    _checked_before_the_pause(old)
    old.save_state(TrainerState(iteration=6))
    assert _snapshot(store, run_id) == before
    for reader in (new, store.open_run(run_id)):
        assert reader.load_state(TrainerState).iteration == 5
    # the old driver's own version is still there, under its own (lower) epoch, read by nobody
    assert fencing.versions(new.storage, "state.json").keys() == {0, new.lock.epoch}


def test_a_checkpoint_whose_manifest_a_woken_driver_writes_over_the_new_drivers_tensors_is_refused(store):
    """The issue's GI case: paused after ``iter_000038.pt``, before its manifest."""
    run_id = _new_run(store)
    old = _driver(store, run_id)
    old.storage.create_exclusive("checkpoints/iter_000038.pt", b"old tensors")  # then the pause
    new = _take_over(store, old)
    data_rel = new.save_checkpoint_bytes("iter_000038", b"new tensors", iteration=38)
    _checked_before_the_pause(old)
    assert data_rel == f"checkpoints/iter_000038.{hashlib.sha256(b'new tensors').hexdigest()[:16]}.pt"
    before = _snapshot(store, run_id)

    with pytest.raises(LeaseLostError):  # the rest of the old driver's save: its manifest
        old.save_checkpoint_bytes("iter_000038", b"old tensors", iteration=38)
    assert _snapshot(store, run_id) == before
    for reader in (new, store.open_run(run_id)):
        assert reader.load_checkpoint_bytes("iter_000038")[0] == b"new tensors"
        assert reader.list_checkpoints() == ["iter_000038"]


def test_a_checkpoint_is_written_once_and_a_repeated_save_is_a_no_op(local_store):
    run_id = _new_run(local_store)
    run = _driver(local_store, run_id)
    assert run.save_checkpoint_bytes("iter_000001", b"tensors", iteration=1) == "checkpoints/iter_000001.pt"
    manifest = run.read_json("checkpoints/iter_000001.json")
    assert manifest["data"] == "iter_000001.pt"
    assert run.save_checkpoint_bytes("iter_000001", b"tensors", iteration=1) == "checkpoints/iter_000001.pt"
    assert run.read_json("checkpoints/iter_000001.json") == manifest  # kept, its time included
    with pytest.raises(WriteOnceConflictError, match="checkpoint manifest"):
        run.save_checkpoint_bytes("iter_000001", b"other tensors", iteration=1)
    assert run.load_checkpoint_bytes("iter_000001")[0] == b"tensors"
    other = f"iter_000001.{hashlib.sha256(b'other tensors').hexdigest()[:16]}.pt"  # kept by content, never read
    assert sorted(run.storage.listdir("checkpoints")) == sorted(["iter_000001.json", "iter_000001.pt", other])


def test_a_stage_summary_keeps_the_first_and_a_woken_driver_cannot_replace_it(local_store):
    run_id = _new_run(local_store)
    old = _driver(local_store, run_id)
    new = _take_over(local_store, old)
    first = {"iteration": 1, "stage": "sample_rollouts", "metrics": {"x": 1}}
    assert new.write_json_keep_first("stages/it1_sample_rollouts.json", first) == first
    # the same stage done again after a crash: the first summary stands
    assert new.write_json_keep_first("stages/it1_sample_rollouts.json", {**first, "metrics": {"x": 2}}) == first
    before = _snapshot(local_store, run_id)
    with pytest.raises(LeaseLostError):
        old.write_json_keep_first("stages/it1_sample_rollouts.json", {**first, "metrics": {"x": 3}})
    assert _snapshot(local_store, run_id) == before


def test_a_run_never_taken_over_keeps_plain_names_and_a_release_keeps_the_epoch(local_store):
    run_id = _new_run(local_store)
    first = _driver(local_store, run_id)
    first.save_state(TrainerState(iteration=1))
    first.lock.release()
    second = _driver(local_store, run_id)  # after a release: no takeover, no new epoch
    assert (second.lock.generation, second.lock.epoch) == (2, 0)
    second.save_state(TrainerState(iteration=2))
    assert fencing.versions(second.storage, "state.json") == {0: "state.json"}
    assert json.loads(second.storage.read_bytes("state.json"))["iteration"] == 2

    _pause(second)
    time.sleep(TTL_S * 1.1)
    third = _driver(local_store, run_id)  # a takeover: epoch 3
    assert (third.lock.generation, third.lock.epoch) == (3, 3)
    third.lock.release()
    fourth = _driver(local_store, run_id)  # after a release: epoch 3 is kept
    assert (fourth.lock.generation, fourth.lock.epoch) == (4, 3)
    fourth.save_state(TrainerState(iteration=4))
    _checked_before_the_pause(second)
    second.save_state(TrainerState(iteration=99))  # two generations late: still invisible
    assert local_store.open_run(run_id).load_state(TrainerState).iteration == 4


def _finished_source(store: RunStore, tensors: bytes, model: str) -> object:
    """A finished run to warm start from: a final checkpoint and a fine-tuned model."""
    source = store.open_run(f"src{uuid.uuid4().hex[:6]}", _params())
    source.save_checkpoint_bytes("iter_000003", tensors, iteration=3)
    source.write_json("state.json", {"iteration": 3, "shared_model_groups": {"prover": {"fine_tuned_model_name": model}}})
    return source


def test_a_woken_driver_preparing_a_warm_start_changes_nothing(store):
    """Paused inside ``prepare_warm_start`` (its state check behind it) and woken after a takeover."""
    first, other = _finished_source(store, b"first", "ft:first"), _finished_source(store, b"other", "ft:other")
    run_id = _new_run(store)
    old = _driver(store, run_id)
    new = _take_over(store, old)
    record = prepare_warm_start(new, first)
    new.save_state(TrainerState(iteration=1))
    before = _snapshot(store, run_id)
    assert before.keys() >= {"warm_start/source.json", "warm_start/iter_000003.pt", "warm_start/models.json"}

    for source in (first, other):  # the same source, or another one (a retraining that found a newer run)
        _checked_before_the_pause(old)
        assert not old.has_state()  # the new driver's state is of a later epoch than the old driver's
        assert prepare_warm_start(old, source) == record  # the record that stands, copied again: no-ops
        assert _snapshot(store, run_id) == before
    reader = store.open_run(run_id)
    assert reader.read_json("warm_start/source.json") == record
    assert reader.storage.read_bytes("warm_start/iter_000003.pt") == b"first"
    assert reader.read_json("warm_start/models.json")["groups"] == {"prover": "ft:first"}
    assert reader.metadata()["warm_start_from"] == record
    with pytest.raises(LeaseLostError):  # and the woken driver stops at its next check
        old.check_lease()

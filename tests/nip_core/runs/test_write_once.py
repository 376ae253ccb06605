"""Write-once run-store files: a driver that lost the run while paused cannot replace them.

The history this guards against: a pure-text EI driver paused (SIGSTOP) during iteration 1's
sampling, another driver took the run over and wrote ``rollouts/1.json`` and the transcripts
(and built its fine-tune jobs from them); the first one, woken, renamed its own files over
them before it noticed the lost lease. Here the two drivers' writes are made in that order
(the paused driver's write comes last, at the instruction it was paused before). Only the
files written once are fenced this way so far; state, metadata and metrics are not (see
docs/architecture.md#one-driver-per-run-leases).
"""

from __future__ import annotations

import uuid

import pytest

from nip_core.environments.nested_array_dict import NestedArrayDict
from nip_core.errors import WriteOnceConflictError
from nip_core.parameters import HyperParameters
from nip_core.runs.lease import LeaseLostError
from nip_core.runs.lock import RunLock
from nip_core.runs.store import RunStore
from nip_core.trainers.pure_text_records import RolloutRecords


def params() -> HyperParameters:
    return HyperParameters(scenario="code_validation", trainer="pure_text_ei", dataset="nipflow-cv")


@pytest.fixture(params=["local", "s3"])
def run(request, tmp_path):
    if request.param == "local":
        location = str(tmp_path / "runs")
    else:
        s3 = request.getfixturevalue("s3_endpoint")
        location = f"s3://{s3.bucket}/runs-{uuid.uuid4().hex[:8]}"
    return RunStore(location).open_run("w1", params())


def test_created_once_the_same_bytes_again_are_a_no_op_and_other_bytes_are_refused(run):
    assert run.write_once("rollouts/1.json", b"first\n", "rollouts") is True
    assert run.write_once("rollouts/1.json", b"first\n", "rollouts") is False
    with pytest.raises(WriteOnceConflictError) as info:
        run.write_once("rollouts/1.json", b"second\n", "rollouts")
    assert run.storage.url("rollouts/1.json") in str(info.value) and "rollouts" in str(info.value)
    assert run.storage.read_bytes("rollouts/1.json") == b"first\n"
    assert [n for n in run.storage.listdir("rollouts")] == ["1.json"]  # no temporary file left


def rollout(answer: str) -> NestedArrayDict:
    """A real code-validation episode: the verifier asks, the prover answers ``answer``, the verifier decides."""
    from tests.nip_core.environments.test_pure_text_env import datapoint, make_env, scripted

    env, dp = make_env(), datapoint()
    act = scripted({0: ("verifier", "Question for Expert: why?", 2), 1: ("prover", answer, 2),
                    2: ("verifier", "Decision: accept", int(dp.y))})
    return env.run_episode(env.reset(dp, seed=1), act)


def test_a_paused_driver_woken_after_a_takeover_replaces_no_rollouts_or_transcripts(run):
    logged = []
    records = [RolloutRecords(run, params().text_rl, ["prover", "verifier"],
                               lambda *a: logged.append(a)) for _ in range(2)]
    paused, new = records
    new.save_rollouts("1", [rollout("Answer: the new driver")])
    new.record_models(1, {"prover": "ft:new-prover", "verifier": "ft:new-verifier"})
    written = {rel: run.storage.read_bytes(rel) for rel in ("rollouts/1.json", "transcripts/raw_1.yaml",
                                                           "models/iter_1.json")}
    # the paused driver wakes with other rollouts of the same iteration in memory
    with pytest.raises(WriteOnceConflictError, match="rollouts/1.json"):
        paused.save_rollouts("1", [rollout("Answer: the paused driver")])
    with pytest.raises(WriteOnceConflictError, match="models/iter_1.json"):
        paused.run.write_json_once("models/iter_1.json", {"prover": "ft:old"}, "models record")
    assert {rel: run.storage.read_bytes(rel) for rel in written} == written
    # what the new driver wrote reads back whole, as it was written
    assert new.load_rollouts("1")[0]["next.raw_message_history"][3][1].tolist() == ["Answer: the new driver", None]
    assert b"the new driver" in written["transcripts/raw_1.yaml"]
    # a repeat of the new driver's own write changes nothing and is no error
    new.save_rollouts("1", [rollout("Answer: the new driver")])
    assert {rel: run.storage.read_bytes(rel) for rel in written} == written


def test_a_driver_that_lost_its_lease_is_told_so(tmp_path):
    store = RunStore(str(tmp_path))
    old = store.open_run("w2", params())
    old.lock = RunLock(old.storage, "w2", ttl_s=0.5)
    old.lock.acquire()
    old.lock.stop_renewing()  # paused: no renewal from now on
    new = store.open_run("w2")
    new.lock = RunLock(new.storage, "w2", ttl_s=0.5)
    new.lock.acquire(wait_s=5)  # the old claim expires
    assert new.lock.generation == old.lock.generation + 1
    new.write_once("rollouts/0.json", b"new\n", "rollouts")
    with pytest.raises(LeaseLostError):
        old.write_once("rollouts/0.json", b"old\n", "rollouts")
    assert new.storage.read_bytes("rollouts/0.json") == b"new\n"
    new.lock.release()

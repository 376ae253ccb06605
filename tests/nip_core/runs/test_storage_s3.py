"""The run store on S3 (moto's server on loopback): fresh reads, single-PUT writes, bounded waits."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from nip_core.runs.lease import Lease
from nip_core.runs.storage import Storage
from nip_core.runs.store import RunStore

REPO = Path(__file__).resolve().parents[3]
DRIVER = str(Path(__file__).with_name("lease_driver.py"))

pytestmark = pytest.mark.slow


def _run_python(code: str, *args: str, env: dict[str, str] | None = None) -> None:
    subprocess.run([sys.executable, "-c", code, *args], check=True, cwd=REPO, timeout=60,
                   env={**os.environ, **(env or {}), "PYTHONPATH": str(REPO)})


def _keys(client, bucket: str, prefix: str) -> list[str]:
    """Every key ever written under ``prefix`` (the bucket keeps all versions)."""
    pages = client.get_paginator("list_object_versions").paginate(Bucket=bucket, Prefix=prefix)
    keys = set()
    for page in pages:
        keys.update(v["Key"] for v in page.get("Versions", []))
        keys.update(m["Key"] for m in page.get("DeleteMarkers", []))
    return sorted(keys)


def test_reads_in_one_process_see_the_writes_of_another_at_once(s3_endpoint):
    """State, metrics and new files written elsewhere are read fresh, never from a stale listing."""
    location = f"s3://{s3_endpoint.bucket}/runs/fresh-{uuid.uuid4().hex[:8]}"
    storage = Storage(location)
    storage.write_bytes("state.json", b'{"iteration": 1}')
    storage.append_line("metrics.jsonl", '{"iteration": 0}')
    assert storage.listdir("") == ["metrics.jsonl", "state.json"]
    assert not storage.exists("checkpoints/a.json")
    assert storage.read_bytes("state.json") == b'{"iteration": 1}'  # the listing is now known here
    _run_python("import sys\nfrom nip_core.runs.storage import Storage\ns = Storage(sys.argv[1])\n"
                "s.write_bytes('state.json', b'{\"iteration\": 2, \"stage\": \"longer now\"}')\n"
                "s.append_line('metrics.jsonl', '{\"iteration\": 1}')\n"
                "s.write_bytes('checkpoints/a.json', b'{}')\n", location)
    assert storage.read_bytes("state.json") == b'{"iteration": 2, "stage": "longer now"}'
    assert storage.read_bytes("metrics.jsonl") == b'{"iteration": 0}\n{"iteration": 1}\n'
    assert storage.exists("checkpoints/a.json")
    assert storage.listdir("checkpoints") == ["a.json"]
    assert storage.listdir("") == ["checkpoints", "metrics.jsonl", "state.json"]


def test_remote_writes_are_single_puts_that_never_create_tmp_objects(s3_endpoint):
    """A write killed at any point cannot leave a ``.tmp-*`` object: none is ever created."""
    bucket = f"nipflow-versioned-{uuid.uuid4().hex[:8]}"
    s3_endpoint.server.create_bucket(bucket)
    client = s3_endpoint.server.client()
    client.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    run = RunStore(f"s3://{bucket}/runs").open_run("exp", _params())
    run.storage.write_bytes("checkpoints/iter_1.pt", b"w" * 100_000)
    run.storage.append_line("metrics.jsonl", '{"iteration": 0}')
    run.storage.append_line("metrics.jsonl", '{"iteration": 1}')
    run.update_metadata(note="x")
    Lease(run.storage, "run", ttl_s=30).acquire().renew()
    written = _keys(client, bucket, "runs/")
    assert "runs/exp/checkpoints/iter_1.pt" in written and "runs/exp/leases/run/0000000001.renew.json" in written
    assert [k for k in written if ".tmp-" in k] == []


def test_tmp_objects_left_by_older_versions_are_ignored(s3_endpoint):
    location = f"s3://{s3_endpoint.bucket}/runs/leftovers-{uuid.uuid4().hex[:8]}"
    store = RunStore(location.rsplit("/", 1)[0])
    run_id = location.rsplit("/", 1)[1]
    run = store.open_run(run_id, _params())
    run.save_checkpoint_bytes("iter_1", b"w")
    client = s3_endpoint.server.client()
    prefix = location[len(f"s3://{s3_endpoint.bucket}/"):]
    for rel in (".tmp-0a1b", "checkpoints/.tmp-0a1b", "leases/run/.tmp-0a1b", "stages/.tmp-0a1b"):
        client.put_object(Bucket=s3_endpoint.bucket, Key=f"{prefix}/{rel}", Body=b"half")
    assert ".tmp-0a1b" not in run.storage.listdir("")
    assert run.storage.listdir("checkpoints") == ["iter_1.json", "iter_1.pt"]
    assert run.storage.listdir("leases/run") == []
    assert run.storage.listdir("stages") == []
    assert run.list_checkpoints() == ["iter_1"]
    assert Lease(run.storage, "run", ttl_s=30).acquire().generation == 1
    assert run_id in store.list_runs()


def _params():
    from nip_core.parameters import HyperParameters

    return HyperParameters.from_dict({"scenario": "graph_isomorphism", "trainer": "vanilla_ppo", "dataset": "test"})


def _line(proc: subprocess.Popen, timeout: float) -> dict:
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"no answer from the driver within {timeout} s"
    line = proc.stdout.readline()
    assert line, f"the driver exited: {proc.stderr.read()[-3000:]}"
    return json.loads(line)


@pytest.mark.timeout(180)
def test_a_holder_cut_off_by_a_stalled_store_stops_before_anyone_may_take_over(s3_endpoint, tmp_path):
    """A renewal that hangs (requests unanswered) times out within the margin; the holder stops.

    The holder reaches moto through a proxy that then stops forwarding; a contender that
    reaches moto directly takes the run over once the claim has expired, by which time
    the holder must have stopped already. Afterwards a plain read through the stalled
    proxy must fail within the store's short timeouts and bounded retries.
    """
    from stall_proxy import StallProxy

    ttl = 3.0
    location = f"s3://{s3_endpoint.bucket}/runs/stalled-{uuid.uuid4().hex[:8]}"
    proxy = StallProxy(s3_endpoint.server.endpoint_url)
    env = {**os.environ, "AWS_ENDPOINT_URL": proxy.url, "PYTHONPATH": str(REPO)}
    holder = subprocess.Popen([sys.executable, DRIVER, "holder", location, "exp", str(ttl), "600"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              cwd=REPO, env=env)
    try:
        locked = _line(holder, 60)
        assert locked["event"] == "locked"
        proxy.stalled.set()  # from now on the holder's requests go unanswered
        contender = Lease(Storage(location), "run", ttl_s=ttl)
        contender.acquire(wait_s=4 * ttl, poll_s=0.05)  # directly on moto
        taken_at = time.time()
        assert contender.generation == 2
        lost = _line(holder, 30)
        assert lost["event"] == "lost", lost
        assert lost["at"] < taken_at  # it had stopped before the takeover
        assert lost["at"] - locked["at"] < ttl  # ... and within one ttl of its claim
        assert holder.wait(30) == 3

        reader = subprocess.run([sys.executable, DRIVER, "reader", location, "exp", "0", "0"], capture_output=True,
                                text=True, cwd=REPO, env=env, timeout=120)
        result = json.loads(reader.stdout.strip().splitlines()[-1])
        assert result["event"] == "read-failed", (result, reader.stderr[-3000:])
        assert result["took_s"] < 40  # short timeouts, few attempts (botocore's defaults: minutes)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        proxy.close()

"""Two real driver processes on one ``s3://`` run (moto's server): the contender reads fresh state.

Neither process nor this test disables any cache: the drivers open the store with
``Storage(location)`` exactly as ``nipflow`` does, so this fails if the run store serves
lease reads from s3fs's directory listing cache (the contender would never see the
holder's renewals and take over a live holder one ttl after the claim, or read a renewal
with a stale ETag and die of ``FileExpired``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nip_core.runs.storage import Storage

REPO = Path(__file__).resolve().parents[3]
DRIVER = str(Path(__file__).with_name("lease_driver.py"))
TTL = 2.0


def _start(role: str, location: str, seconds: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, DRIVER, role, location, "exp", str(TTL), str(seconds)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})


def _event(line: str) -> dict:
    assert line, "the driver printed nothing"
    return json.loads(line)


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("first_look", ["before_the_first_renewal", "after_some_renewals"])
def test_a_waiting_contender_sees_the_renewals_of_a_live_holder_on_s3(s3_endpoint, first_look):
    """The holder renews for 5 ttl; the contender waits 3 ttl meanwhile and must be refused.

    ``before_the_first_renewal``: the contender's first listing holds only the claim (a
    cached listing would hide every renewal: takeover one ttl after the claim).
    ``after_some_renewals``: its first listing holds a renewal too (a cached ETag would
    make a later read of the rewritten renewal fail with ``FileExpired``).
    """
    location = f"s3://{s3_endpoint.bucket}/runs/live-holder-{first_look}-{time.time_ns()}"
    contender = _start("contender", location, 3 * TTL)  # waits 3 ttl, all within the hold
    holder = None
    try:
        assert _event(contender.stdout.readline()) == {"event": "ready"}  # imported: its first look is quick
        holder = _start("holder", location, 5 * TTL)  # renews for at least 5 ttl
        locked = _event(holder.stdout.readline())
        assert (locked["event"], locked["generation"]) == ("locked", 1)
        if first_look == "after_some_renewals":
            time.sleep(1.5 * TTL)
        contender.stdin.write("go\n")
        contender.stdin.flush()
        out, err = contender.communicate(timeout=60)
        result = _event(out.strip().splitlines()[-1] if out.strip() else "")
        assert result["event"] == "refused", f"contender: {result}\n{err[-3000:]}"
        assert "FileExpired" not in err
        assert result["after_s"] >= 3 * TTL - 0.5  # it waited for the holder, not crashed early
        assert "generation=1" in result["message"]
        out, err = holder.communicate(timeout=60)  # closes its stdin: it stops after its minimum hold
        held = _event(out.strip().splitlines()[-1])
        assert held["event"] == "held" and held["generation"] == 1, f"holder: {held}\n{err[-3000:]}"
        assert held["held_s"] >= 5 * TTL - 0.5
        assert holder.returncode == 0
    finally:
        for proc in (holder, contender):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    # Nobody ever claimed generation 2: the live holder was never taken over.
    claims = sorted(n for n in Storage(location).listdir("leases/run") if not n.endswith(".renew.json"))
    assert claims == ["0000000001.json"]

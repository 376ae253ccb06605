"""A real S3 endpoint for the end-to-end tests: moto's standalone server (``moto_server``).

``moto_server -H 127.0.0.1 -p PORT`` answers the S3 API over HTTP like AWS does (in
memory; the data goes with the process). Processes reach it with nothing but the
standard AWS environment (:meth:`S3Server.env`):

* ``AWS_ENDPOINT_URL`` - botocore (>= 1.31) sends every request there. s3fs picks it up
  through aiobotocore without any fsspec setting (checked with s3fs 2026.9 / botocore
  1.43): no ``FSSPEC_S3_ENDPOINT_URL`` and no ``client_kwargs`` are needed;
* ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` (moto accepts any) and
  ``AWS_DEFAULT_REGION``;
* ``AWS_CONFIG_FILE`` / ``AWS_SHARED_CREDENTIALS_FILE`` pointing nowhere and
  ``AWS_EC2_METADATA_DISABLED=true``, so that no profile of the machine and no instance
  metadata lookup can interfere.

Buckets are created with ``CreateBucketConfiguration={"LocationConstraint": region}``:
outside ``us-east-1`` S3 (and moto) refuses a bucket without one, which is also why
``s3fs.mkdir(bucket)`` fails there unless it is given ``region_name``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from flows.pg_cluster import free_port

MOTO_SERVER = str(Path(sys.executable).parent / "moto_server")
REGION = "eu-west-1"
_PORT_ATTEMPTS = 5


@dataclass
class S3Server:
    """A running ``moto_server`` on 127.0.0.1 and the AWS settings of its clients."""

    endpoint_url: str
    proc: subprocess.Popen
    log: Path
    region: str = REGION

    def env(self) -> dict[str, str]:
        """The environment of a process that uses this endpoint (credentials are moto's dummies)."""
        return {"AWS_ENDPOINT_URL": self.endpoint_url, "AWS_ACCESS_KEY_ID": "nipflow-e2e",
                "AWS_SECRET_ACCESS_KEY": "nipflow-e2e-secret", "AWS_DEFAULT_REGION": self.region,
                "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
                "AWS_EC2_METADATA_DISABLED": "true"}

    def client(self):
        import boto3

        env = self.env()
        return boto3.client("s3", endpoint_url=self.endpoint_url, region_name=self.region,
                            aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"])

    def create_bucket(self, name: str) -> None:
        self.client().create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": self.region})

    def fs(self):
        """A new s3fs file system on this endpoint, with no listing cache shared with others."""
        import s3fs

        env = self.env()
        return s3fs.S3FileSystem(key=env["AWS_ACCESS_KEY_ID"], secret=env["AWS_SECRET_ACCESS_KEY"],
                                 endpoint_url=self.endpoint_url, client_kwargs={"region_name": self.region},
                                 skip_instance_cache=True, use_listings_cache=False)

    def stop(self) -> None:
        for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
            if self.proc.poll() is not None:
                return
            try:
                os.killpg(self.proc.pid, sig)
                self.proc.wait(wait)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/moto-api/", timeout=2):
            return True
    except urllib.error.HTTPError:
        return True  # it answered
    except OSError:
        return False


def start_s3_server(base: Path, startup_timeout: float = 60) -> S3Server:
    """``moto_server`` on a free loopback port, answering HTTP when returned.

    A port taken between its choice and the bind makes the server exit at once; it is
    retried on another port.
    """
    base.mkdir(parents=True, exist_ok=True)
    log = base / "moto.log"
    for attempt in range(1, _PORT_ATTEMPTS + 1):
        port = free_port()
        offset = log.stat().st_size if log.exists() else 0
        with open(log, "ab") as out:
            proc = subprocess.Popen([MOTO_SERVER, "-H", "127.0.0.1", "-p", str(port)], cwd=base,
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        server = S3Server(endpoint_url=f"http://127.0.0.1:{port}", proc=proc, log=log)
        deadline = time.monotonic() + startup_timeout
        while time.monotonic() < deadline and proc.poll() is None:
            if _answers(server.endpoint_url):
                return server
            time.sleep(0.2)
        exited = proc.poll() is not None
        server.stop()
        text = log.read_bytes()[offset:].decode(errors="replace")
        if exited and "in use" in text and attempt < _PORT_ATTEMPTS:
            continue
        state = f"exited {proc.returncode}" if exited else f"did not answer within {startup_timeout} s"
        raise RuntimeError(f"moto_server on port {port} {state}:\n{text[-3000:]}")
    raise RuntimeError(f"moto_server found no free port in {_PORT_ATTEMPTS} attempts")

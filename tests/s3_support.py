"""A local S3 endpoint for tests: moto's standalone server on 127.0.0.1 (no AWS account).

s3fs (through botocore) reads the endpoint and credentials from the standard AWS
environment variables, which :attr:`MotoS3.env` holds for child processes.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

REGION = "eu-west-1"  # moto refuses a LocationConstraint of us-east-1 on CreateBucket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class MotoS3:
    """A running ``moto_server``; ``env`` points S3 clients at it."""

    process: subprocess.Popen
    url: str
    bucket: str
    env: dict[str, str] = field(default_factory=dict)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_moto_s3(log_dir: Path, bucket: str = "nipflow-test") -> MotoS3:
    """Start moto's S3 server on a free port, create ``bucket`` and return the handle."""
    exe = shutil.which("moto_server", path=str(Path(sys.executable).parent)) or shutil.which("moto_server")
    if exe is None:
        raise RuntimeError("moto_server not found: install the dev extra (moto[server])")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(log_dir / "moto.log", "wb")
    proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"{url}/moto-api/", timeout=2).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"moto_server did not start; see {log_dir / 'moto.log'}") from None
            time.sleep(0.1)
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION,
           "AWS_ENDPOINT_URL": url, "AWS_EC2_METADATA_DISABLED": "true"}
    handle = MotoS3(proc, url, bucket, env)
    try:
        import s3fs

        s3fs.S3FileSystem(key=env["AWS_ACCESS_KEY_ID"], secret=env["AWS_SECRET_ACCESS_KEY"], skip_instance_cache=True,
                          client_kwargs={"endpoint_url": url, "region_name": REGION}).mkdir(bucket, region_name=REGION)
    except Exception:
        handle.stop()
        raise
    return handle


@contextmanager
def environ(values: dict[str, str]) -> Iterator[None]:
    """Set ``values`` in ``os.environ`` for the body, then restore what was there."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

"""Suite-wide settings: hermetic, single-threaded, no network, no user profiles."""

import os

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("RL_WARNINGS", "0")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
# Run leases expire after 60 s by default; killed-and-resumed runs in tests would wait
# that long for a dead driver's claim to lapse. Subprocesses inherit this.
os.environ.setdefault("NIPFLOW_LEASE_TTL_S", "5")
for _var in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "PREFECT_API_URL"):
    os.environ.pop(_var, None)

# A suite started as a background job of a non-interactive shell (`cmd &`) inherits SIGINT
# ignored, and one under `nohup` SIGHUP: Python then installs no KeyboardInterrupt handler, and
# the children the tests start (servers, workers, runs) inherit the ignored signals. The Ctrl-C
# and hang-up tests need the defaults; a Python handler is reset to the default on exec.
import signal  # noqa: E402

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)

import torch  # noqa: E402

torch.set_num_threads(1)


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory):
    """moto's S3 server with a bucket, for the session; its AWS_* variables are set here too."""
    from types import SimpleNamespace

    from moto_s3_process import start_s3_server

    server = start_s3_server(tmp_path_factory.mktemp("moto"))
    try:
        server.create_bucket("nipflow-test")
        env = server.env()
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            yield SimpleNamespace(server=server, bucket="nipflow-test", env=env)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    finally:
        server.stop()


@pytest.fixture(scope="session")
def smollm2_data_dir(tmp_path_factory):
    """A data directory holding ``smollm2-135m-instruct`` de-quantised, shared by the session's workers.

    The first worker to get here de-quantises it (about 30 s); the others wait on the lock and
    find it done. Set it as ``NIPFLOW_DATA_DIR`` for a server that serves the model.
    """
    from filelock import FileLock

    from nipflow_llm_server.engines import smollm2

    shared = tmp_path_factory.getbasetemp().parent / "smollm2-data"  # the same for every xdist worker
    shared.mkdir(parents=True, exist_ok=True)
    with FileLock(str(shared) + ".lock"):
        smollm2.materialise(shared)
    return shared


@pytest.fixture
def one_thread():
    """One torch thread for the test (results and timings as on the calibrating runs), restored after."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def pytest_collection_modifyitems(items):
    """The order the parallel suite runs in: whole modules per xdist worker, their long tests
    first (``tests/xdist_order.py``). Every worker computes the same order."""
    from xdist_order import deal, timed

    def info(item):
        long = item.get_closest_marker("long")
        return timed(item.nodeid.split("::")[0], long.args[0] if long is not None else None,
                     item.get_closest_marker("e2e") is not None, item.get_closest_marker("slow") is not None)

    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    items[:] = deal(items, [info(item) for item in items], workers)

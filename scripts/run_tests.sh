#!/usr/bin/env bash
# Run the whole test suite hermetically: no W&B network, no Prefect profile of the user,
# one torch thread per process.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
export WANDB_MODE=offline WANDB_SILENT=true RL_WARNINGS=0 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
export PREFECT_SERVER_ANALYTICS_ENABLED=false PREFECT_LOGGING_LEVEL=WARNING
unset PREFECT_API_URL OPENAI_BASE_URL OPENAI_API_KEY
# Debian's Chromium for the browser tests; if it cannot be installed the suite still runs
# and tests/e2e/test_browser_ui.py fails (never skips) naming what is missing.
./scripts/ensure_browser.sh || echo "warning: scripts/ensure_browser.sh failed: the browser tests will fail" >&2
# One xdist worker per usable core (NIPFLOW_TEST_WORKERS=N for another count, 0 for one
# process): most of an end-to-end test's wall time is spent waiting on servers and workers.
# GNU nproc reports OMP_NUM_THREADS when it is set: count the cores without it.
workers="${NIPFLOW_TEST_WORKERS:-$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)}"
set +e
.venv/bin/python -m pytest -q --timeout=1800 --durations=40 -n "$workers" --dist worksteal "$@"
rc=$?
set -e
# pytest's exit code 5 means no test was collected: that is a failure here.
exit $rc

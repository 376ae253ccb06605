#!/usr/bin/env bash
# Run the whole test suite hermetically: no W&B network, no Prefect profile of the user,
# one torch thread per process.
#
# Without arguments the suite runs as two pytest processes side by side, one per core:
# tests/e2e (real Prefect servers on PostgreSQL, several workers, a browser; one test after
# another) and everything else. Their outputs are printed when both have finished; the exit
# status is the first non-zero one. With arguments (a path, -k ...) one pytest runs them.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
export WANDB_MODE=offline WANDB_SILENT=true RL_WARNINGS=0 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
export PREFECT_SERVER_ANALYTICS_ENABLED=false PREFECT_LOGGING_LEVEL=WARNING
unset PREFECT_API_URL OPENAI_BASE_URL OPENAI_API_KEY
# Debian's Chromium for the browser tests; if it cannot be installed the suite still runs
# and tests/e2e/test_browser_ui.py fails (never skips) naming what is missing.
./scripts/ensure_browser.sh || echo "warning: scripts/ensure_browser.sh failed: the browser tests will fail" >&2
pytest=(.venv/bin/python -m pytest -q --timeout=900 --durations=25)
if [ "$#" -gt 0 ]; then
  set +e
  "${pytest[@]}" "$@"
  exit $?  # pytest's 5 (no test collected) is a failure here too
fi
logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT
progress() { grep -o '\[ *[0-9]*%\]' "$1" | tail -n 1 | tr -d '[] ' || true; }
started=$SECONDS
set +e
"${pytest[@]}" tests/e2e >"$logs/e2e.log" 2>&1 &
e2e=$!
"${pytest[@]}" --ignore=tests/e2e >"$logs/rest.log" 2>&1 &
rest=$!
# a line a minute, so that a CI log shows the suite is alive
while kill -0 "$e2e" 2>/dev/null || kill -0 "$rest" 2>/dev/null; do
  sleep 60
  echo "tests: $(( (SECONDS - started) / 60 )) min; tests/e2e at $(progress "$logs/e2e.log")," \
       "the rest at $(progress "$logs/rest.log")"
done
wait "$e2e"; e2e_status=$?
wait "$rest"; rest_status=$?
set -e
echo "===== tests/e2e (exit $e2e_status) ====="
cat "$logs/e2e.log"
echo "===== the rest of the suite (exit $rest_status) ====="
cat "$logs/rest.log"
echo "whole suite: $(( SECONDS - started )) s"
if [ "$e2e_status" -ne 0 ]; then exit "$e2e_status"; fi
exit "$rest_status"

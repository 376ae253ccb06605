#!/usr/bin/env bash
# The main job on the embedded defaults: on hard data (wl-small), nip's verifier and the same
# verifier alone (solo_verifier), same architecture and budget, trained one after another as
# a `nipflow sweep` through a temporary local Prefect server; run store ./runs; W&B offline.
# Ends with the comparison card (each held-out accuracy, the difference with its spread, the
# wall time). Extra arguments go to `nipflow sweep` (e.g. --set rl.num_iterations=20,
# --sweep-id NAME, --runs-dir DIR); the sweep id defaults to main-<UTC date and time>.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
# One torch thread, as in the calibration the README reports: results depend on the thread count.
export WANDB_MODE="${WANDB_MODE:-offline}" RL_WARNINGS=0 OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
sweep_id=()
case " $* " in
  *" --sweep-id "* | *" --sweep-id="*) ;;
  *) sweep_id=(--sweep-id "main-$(date -u +%Y%m%d-%H%M%S)") ;;
esac
exec .venv/bin/nipflow sweep configs/sweeps/gi_main.json --params configs/gi_main_weak_verifier.json \
  "${sweep_id[@]}" "$@"

#!/usr/bin/env bash
# The main job on the embedded defaults: graph-isomorphism vanilla PPO with the nip
# protocol, run through a temporary local Prefect server; run store ./runs; W&B offline.
# Extra arguments are passed to `nipflow run` (e.g. --set rl.num_iterations=200).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
export WANDB_MODE="${WANDB_MODE:-offline}" RL_WARNINGS=0
exec .venv/bin/nipflow run graph_isomorphism vanilla_ppo --protocol nip \
  --params configs/gi_nip_ppo_main.json "$@"

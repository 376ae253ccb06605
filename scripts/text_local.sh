#!/usr/bin/env bash
# `make text-local`: a short expert-iteration run of code validation on the built-in real
# language model (SmolLM2-135M-Instruct), offline, on a CPU (docs/text_backends.md#text-local).
# Through scripts/with_smollm2_server.sh (the transformers engine's server, stopped at the end),
# `nipflow run code_validation pure_text_ei --params configs/cv_smollm2_short.json`: the
# verifier alone, 2 iterations of 16 rollouts, one LoRA epoch, 8 held-out items tested at the end, through a
# temporary local Prefect server, W&B offline. The result card shows each iteration's
# valid-decision rate, accuracy and times. Extra arguments go to `nipflow run` (e.g.
# --protocol nip --set nip_protocol.min_message_rounds=3, --set seed=1, --runs-dir DIR, --run-id ID, --direct).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
export WANDB_MODE="${WANDB_MODE:-offline}" RL_WARNINGS=0
exec ./scripts/with_smollm2_server.sh .venv/bin/nipflow run code_validation pure_text_ei \
  --params configs/cv_smollm2_short.json "$@"

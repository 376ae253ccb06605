#!/usr/bin/env bash
# Runs a command against the built-in real language model (SmolLM2-135M-Instruct), offline:
# starts `nipflow api-server --engine transformers --base-model smollm2-135m-instruct --device cpu`
# on a free port (its state in $NIPFLOW_DATA_DIR/api_server_smollm2, by default
# ~/.cache/nipflow/data/api_server_smollm2), runs the command with OPENAI_BASE_URL pointing at
# it, stops the server, and exits with the command's status. docs/text_backends.md#text-local
#   scripts/with_smollm2_server.sh .venv/bin/nipflow run code_validation pure_text_ei ...
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: scripts/with_smollm2_server.sh COMMAND [ARG...]" >&2; exit 2; }
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
data_root="${NIPFLOW_DATA_DIR:-$HOME/.cache/nipflow/data}"
server_dir="$data_root/api_server_smollm2"
mkdir -p "$server_dir"
# without WANDB_MODE: the server logs nothing to W&B, and transformers would announce the mode
env -u WANDB_MODE "$root/.venv/bin/nipflow" api-server --engine transformers --base-model smollm2-135m-instruct \
  --device cpu --port 0 --data-dir "$server_dir" --log-level warning &
server_pid=$!
stop_server() { kill -TERM "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null || true; }
trap stop_server EXIT
# the server records its pid and address in server.json once it listens (the model loads on first use)
base_url=""
for _ in $(seq 1200); do
  kill -0 "$server_pid" 2>/dev/null || { echo "with_smollm2_server: the API server exited" >&2; exit 1; }
  base_url="$("$root/.venv/bin/python" - "$server_dir/server.json" "$server_pid" <<'PY'
import json, sys
try:
    info = json.load(open(sys.argv[1]))
except (OSError, ValueError):
    sys.exit(0)
if info.get("pid") == int(sys.argv[2]):
    print(info["base_url"])
PY
)"
  [ -n "$base_url" ] && break
  sleep 0.25
done
[ -n "$base_url" ] || { echo "with_smollm2_server: the API server did not start in 5 min" >&2; exit 1; }
status=0
OPENAI_BASE_URL="$base_url" OPENAI_API_KEY="${NIPFLOW_API_SERVER_KEY:-local}" "$@" || status=$?
exit "$status"

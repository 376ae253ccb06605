# The two commands of the README. Both install what they need into .venv/ first.
.PHONY: run test venv test-fast text-local

venv:
	@./scripts/ensure_venv.sh

# Main job on the embedded defaults: graph-isomorphism PPO (nip protocol) through a local
# Prefect server, run store in ./runs, W&B offline.
run: venv
	@./scripts/main_job.sh

# A short expert-iteration run of code validation on the built-in real language model
# (SmolLM2-135M-Instruct) through its local server, offline, on a CPU (docs/text_backends.md#text-local).
text-local: venv
	@./scripts/text_local.sh

# The whole test suite (slow and end-to-end tests included).
test: venv
	@./scripts/run_tests.sh

test-fast: venv
	@.venv/bin/python -m pytest -q -m "not slow and not e2e"

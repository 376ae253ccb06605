# The two commands of the README. Both install what they need into .venv/ first.
.PHONY: run test venv test-fast

venv:
	@./scripts/ensure_venv.sh

# Main job on the embedded defaults: graph-isomorphism PPO (nip protocol) through a local
# Prefect server, run store in ./runs, W&B offline.
run: venv
	@./scripts/main_job.sh

# The whole test suite (slow and end-to-end tests included).
test: venv
	@./scripts/run_tests.sh

test-fast: venv
	@.venv/bin/python -m pytest -q -m "not slow and not e2e"

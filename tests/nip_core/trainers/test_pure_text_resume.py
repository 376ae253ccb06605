"""Resume of pure_text_ei (and pure_text_malt) after SIGKILL in every stage (and between two
groups' job creations).

A driver process (:func:`main`, run as ``python -c``) trains a run in the run store; the
test-only ``NIPFLOW_TEST_KILL_AT`` makes it SIGKILL itself at listed points, each point
once (markers), through the point hook that :mod:`tests.kill_points` registers in it.
The driver is restarted until it finishes; then the final state is compared with an
uninterrupted run's (iteration-0 rollouts and the uploaded fine-tune data must be
byte-identical; later rollouts are not, because the local server seeds a
model's sampling with the model's name, which holds the run id and the random job id,
so the state is compared without ``tokens_used`` and with model names reduced to their
base model), the server must hold exactly one job per
(iteration, group) and no rollout file may change once written.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from nipflow_llm_server.testing import local_api_server
from tests.run_files import run_file, run_json

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

KILL_POINTS = [
    "0:sample_rollouts:before_save", "0:sample_rollouts:end", "0:log_stats:end",
    "0:test_during_training:end", "0:create_fine_tune_jobs:after_prover", "0:create_fine_tune_jobs:end",
    "0:await_fine_tune_jobs:start", "0:await_fine_tune_jobs:end", "1:sample_rollouts:before_save",
    "1:test_during_training:end", "2:test:start",
]
MALT_KILL_POINTS = [
    "0:sample_rollouts:before_save", "0:log_stats:end", "0:create_fine_tune_jobs:after_prover",
    "0:create_fine_tune_jobs:end", "0:await_fine_tune_jobs:start", "1:sample_rollouts:end", "2:test:start",
]
REPO = Path(__file__).resolve().parents[3]


def main() -> None:
    """Driver: ``argv = runs_dir run_id base_url trainer``; trains (resuming) the run."""
    import nip_core.trainers.catalogue  # noqa: F401
    from nip_core.parameters import HyperParameters
    from nip_core.settings import ExperimentSettings
    from nip_core.trainers.build import build_trainer
    from tests.kill_points import install_from_env

    install_from_env()
    runs_dir, run_id, url, trainer_name = sys.argv[1:5]
    if trainer_name == "pure_text_malt":  # 20 trees of up to 2**3 rollouts
        hp = HyperParameters(scenario="code_validation", trainer="pure_text_malt", dataset="nipflow-cv",
                             rl={"num_iterations": 2, "rollouts_per_iteration": 20, "num_test_iterations": 1},
                             nip_protocol={"max_message_rounds": 3}, pure_text_malt={"num_responses_per_timestep": 2},
                             dataset_options={"max_train_size": 20, "max_test_size": 4},
                             text_rl={"test_scheme": "last"})
    else:
        hp = HyperParameters(scenario="code_validation", trainer="pure_text_ei", dataset="nipflow-cv",
                             rl={"num_iterations": 2, "rollouts_per_iteration": 24, "num_test_iterations": 1},
                             nip_protocol={"max_message_rounds": 4},
                             dataset_options={"max_train_size": 24, "max_test_size": 4},
                             text_rl={"verifier_guess_replacement_proportion": 0.5, "test_scheme": "last"})
    st = ExperimentSettings(use_wandb=False, runs_dir=runs_dir, run_id=run_id, openai_base_url=url,
                            fine_tune_poll_interval_s=0.1, fine_tune_poll_max_interval_s=0.5,
                            max_concurrent_requests=8, show_progress=False)
    trainer = build_trainer(hp, st)
    with trainer.run.lock:
        trainer.train()
    trainer.close()


def drive(runs_dir: Path, run_id: str, url: str, kill_points: list[str], markers: Path,
          trainer: str = "pure_text_ei") -> int:
    env = {**os.environ, "NIPFLOW_TEST_KILL_AT": ",".join(kill_points), "NIPFLOW_TEST_KILL_MARKERS": str(markers),
           "PYTHONPATH": str(REPO)}
    code = "from tests.nip_core.trainers.test_pure_text_resume import main; main()"
    proc = subprocess.run([sys.executable, "-c", code, str(runs_dir), run_id, url, trainer], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    if proc.returncode not in (0, -signal.SIGKILL):
        raise AssertionError(f"driver failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc.returncode


def rollout_files(run_dir: Path) -> dict[str, tuple[str, int]]:
    out = {}
    for p in sorted((run_dir / "rollouts").glob("*.json")) if (run_dir / "rollouts").exists() else []:
        out[p.name] = (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
    return out


def comparable_state(run_dir: Path) -> dict:
    state = run_json(run_dir, "state.json") if run_file(run_dir, "state.json").exists() else None
    assert state is not None, f"no state in {run_dir}: {sorted(os.listdir(run_dir))}"
    state.pop("tokens_used")
    for g in state["shared_model_groups"].values():  # ids differ between servers' jobs; names carry run ids
        g["fine_tune_job_id"] = g["fine_tune_job_id"] is not None
        g["fine_tuned_model_name"] = (g["fine_tuned_model_name"] or "").split(":")[1:2]
    return state


def kill_resume_and_compare(tmp_path: Path, trainer: str, kill_points: list[str]) -> list[tuple[str, str]]:
    """Run ``clean`` uninterrupted and ``killed`` through ``kill_points``; check; return the job keys."""
    with local_api_server(tmp_path, job_time_scale=0.02) as server:
        runs = tmp_path / "runs"
        assert drive(runs, "clean", server.base_url, [], tmp_path, trainer) == 0
        markers = tmp_path / "markers"
        markers.mkdir()
        seen: dict[str, tuple[str, int]] = {}
        kills = 0
        for _ in range(len(kill_points) + 2):
            rc = drive(runs, "killed", server.base_url, kill_points, markers, trainer)
            files = rollout_files(runs / "killed")
            for name, fingerprint in seen.items():
                assert files.get(name) == fingerprint, f"rollouts/{name} was lost or rewritten"
            seen.update(files)
            if rc == 0:
                break
            kills += 1
        assert rc == 0 and kills == len(kill_points)
        assert sorted(os.listdir(markers)) == sorted(p.replace(":", "_") for p in kill_points)
        client = server.client()
        all_jobs = client.fine_tuning.jobs.list(limit=100).data

        def job_keys(run_id):
            return sorted((j.metadata["nipflow_iteration"], j.metadata["nipflow_group"]) for j in all_jobs
                          if (j.metadata or {}).get("nipflow_run_id") == run_id)

        keys = job_keys("killed")
        assert keys and keys == job_keys("clean")  # one job per (iteration, group), none repeated
        jobs = [j for j in all_jobs if (j.metadata or {}).get("nipflow_run_id") == "killed"]
        state = run_json(runs / "killed", "state.json")
        assert {g: state["shared_model_groups"][g]["fine_tuned_model_name"] for _, g in keys} == \
            {j.metadata["nipflow_group"]: client.fine_tuning.jobs.retrieve(j.id).fine_tuned_model for j in jobs}
        for _, group in keys:
            files = [run_json(runs / r, f"fine_tune/iter_0_{group}.json")["file_id"]
                     for r in ("clean", "killed")]
            assert client.files.content(files[0]).read() == client.files.content(files[1]).read()
    assert set(seen) == {"0.json", "1.json", "test_1.json"}
    assert rollout_files(runs / "clean")["0.json"][0] == rollout_files(runs / "killed")["0.json"][0]
    assert comparable_state(runs / "killed") == comparable_state(runs / "clean")
    return keys


@pytest.mark.long(110)
def test_sigkill_in_every_stage_then_resume_matches_an_uninterrupted_run(tmp_path):
    keys = kill_resume_and_compare(tmp_path, "pure_text_ei", KILL_POINTS)
    assert keys == [("0", "prover"), ("0", "verifier")]


@pytest.mark.long(95)
def test_malt_sigkill_then_resume_matches_an_uninterrupted_run(tmp_path):
    keys = kill_resume_and_compare(tmp_path, "pure_text_malt", MALT_KILL_POINTS)
    assert ("0", "verifier") in keys and all(it == "0" for it, _ in keys)

"""W&B offline logging: one W&B run id across a resume, no duplicated steps, no secrets."""

import subprocess
import sys
import textwrap

from nip_core.logging.wandb_reader import read_offline_runs
from nip_core.parameters import HyperParameters
from nip_core.runs import RunStore

SCRIPT = textwrap.dedent("""
    import os, sys
    from nip_core.logging import build_stat_logger
    from nip_core.parameters import HyperParameters
    from nip_core.runs import RunStore
    from nip_core.settings import ExperimentSettings
    runs, start, stop = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    settings = ExperimentSettings(run_id="wb1", runs_dir=runs, wandb_mode="offline")
    run = RunStore(runs).open_run("wb1")
    logger = build_stat_logger(run.params, settings, run)
    for it in range(start, stop):
        logger.log({"verifier.mean_episode_reward": it / 10, "mean_accuracy": 0.5 + it / 100}, step=it)
    logger.close()
""")


def test_resume_continues_the_same_wandb_run(tmp_path):
    params = HyperParameters.from_dict({"scenario": "graph_isomorphism", "trainer": "vanilla_ppo",
                                        "dataset": "test", "rl": {"num_iterations": 5}})
    RunStore(str(tmp_path)).open_run("wb1", params)
    env = {"PATH": "/usr/bin:/bin", "WANDB_SILENT": "true", "OPENAI_API_KEY": "sk-SENTINEL-wandb-1234567890abcdef",
           "PYTHONPATH": "."}
    # first process logs 0..2, the "resumed" one re-logs 2 (must be skipped) and 3..4
    for start, stop in ((0, 3), (2, 5)):
        subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), str(start), str(stop)], check=True,
                       env=env, timeout=120)
    runs = read_offline_runs(str(tmp_path / "wb1"))
    assert len(runs) == 2
    assert {r["run_id"] for r in runs} == {RunStore(str(tmp_path)).open_run("wb1").metadata()["wandb_run_id"]}
    steps = [row["_step"] for r in runs for row in r["history"]]
    assert steps == [0, 1, 2, 3, 4]
    assert runs[0]["config"]["rl"]["num_iterations"] == 5
    assert set(runs[0]["history"][0]) >= {"verifier.mean_episode_reward", "mean_accuracy"}
    # the sentinel key never reaches the run store or the W&B directory
    for path in (tmp_path / "wb1").rglob("*"):
        if path.is_file():
            assert b"SENTINEL" not in path.read_bytes(), path

"""Orchestration overhead: the same runs directly (``Trainer.train()``) and through the flows.

Starts a local ``prefect server`` on 127.0.0.1 (its start-up time is printed separately
and not counted), then times

* a small graph-isomorphism PPO run: ``train()`` vs ``train_experiment`` (GPU-tagged
  block subflows), and
* a small pure-text EI run against the local API server: ``train()`` vs
  ``train_experiment`` (one task per stage),

and prints the wall-time ratio of the PPO run and the overhead per stage of the text
run. Last line: ``ppo_ratio=<float> text_overhead_per_stage_s=<float>``.

Usage::

    .venv/bin/python benchmarks/orchestration_overhead.py [--iterations 20] [--block-size 10]
        [--text-iterations 2] [--fake-trainers] [--skip-ppo] [--job-time-scale 0.02]

``--fake-trainers`` uses the cheap stand-in trainers of ``tests/flows/nipflow_fakes.py``:
it then measures the pure orchestration cost (useful before the real trainers exist).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(home: Path) -> tuple[subprocess.Popen, str, float]:
    port = _free_port()
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_SERVER_UI_API_URL": f"http://127.0.0.1:{port}/api"}
    env.pop("PREFECT_API_URL", None)
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                             "--port", str(port)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}/api"
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=1) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.perf_counter() - t0 > 180:
            raise RuntimeError("prefect server did not start")
        time.sleep(0.2)
    return proc, url, time.perf_counter() - t0


def _parameters(scenario, trainer, run_id, runs_dir, overrides, block_size, extra_settings):
    from flows.parameters import ExperimentParameters

    return ExperimentParameters(scenario=scenario, trainer=trainer, run_id=run_id, runs_dir=runs_dir,
                                overrides=overrides, block_size=block_size, wait_mode="poll",
                                settings_overrides=extra_settings)


def time_direct(parameters) -> float:
    from nip_core.trainers import build_trainer

    hp = parameters.hyper_params()
    t0 = time.perf_counter()
    trainer = build_trainer(hp, parameters.settings(hp))
    try:
        trainer.train()
    finally:
        trainer.close()
    return time.perf_counter() - t0


def time_flow(parameters) -> tuple[float, dict]:
    from flows.experiment import train_experiment

    t0 = time.perf_counter()
    state = train_experiment(parameters, return_state=True)
    elapsed = time.perf_counter() - t0
    if not state.is_completed():
        raise RuntimeError(f"flow run ended {state.name}: {state.message}")
    return elapsed, state.result()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--block-size", type=int, default=10)
    ap.add_argument("--text-iterations", type=int, default=2)
    ap.add_argument("--fake-trainers", action="store_true")
    ap.add_argument("--skip-ppo", action="store_true", help="time only the pure-text run")
    ap.add_argument("--job-time-scale", type=float, default=0.02,
                    help="duration scale of the local server's fine-tune jobs")
    args = ap.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="nipflow-bench-"))
    server, url, startup = start_server(work / "prefect-home")
    print(f"prefect server start-up: {startup:.2f} s ({url})")
    os.environ.update(PREFECT_API_URL=url, PREFECT_HOME=str(work / "client-home"),
                      PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_LOGGING_LEVEL="WARNING")
    extra: dict = {}
    try:
        import torch

        torch.set_num_threads(1)
        if args.fake_trainers:
            sys.path.insert(0, str(REPO / "tests" / "flows"))
            import nipflow_fakes

            nipflow_fakes.install()
        runs = str(work / "runs")
        if not args.fake_trainers:
            # Short fine-tune jobs polled every 50 ms: the wait then costs the same in both
            # modes, and what differs is the orchestration (with 1 s jobs and a backing-off
            # poll, the poll's phase alone moves a stage by a second).
            from nip_core.llm.launcher import LocalApiServer

            api = LocalApiServer(work / "api", job_time_scale=args.job_time_scale)
            api.start()
            extra = {"openai_base_url": api.base_url, "fine_tune_poll_interval_s": 0.05,
                     "fine_tune_poll_max_interval_s": 0.05}

        from nip_core.trainers import UnknownTrainerError

        ppo_ratio = per_stage = float("nan")
        gi = ["graph_isomorphism", "vanilla_ppo"]
        gi_over = [f"rl.num_iterations={args.iterations}"]
        try:
            if args.skip_ppo:
                raise UnknownTrainerError("skipped (--skip-ppo)")
            d_ppo = time_direct(_parameters(*gi, "ppo-direct", runs, gi_over, args.block_size, {}))
            f_ppo, _ = time_flow(_parameters(*gi, "ppo-flow", runs, gi_over, args.block_size, {}))
            ppo_ratio = f_ppo / d_ppo
            print(f"PPO {args.iterations} iterations: direct {d_ppo:.2f} s, flow {f_ppo:.2f} s, "
                  f"ratio {ppo_ratio:.3f}")
        except UnknownTrainerError as e:
            print(f"PPO run skipped: {e.args[0]}")

        cv = ["code_validation", "pure_text_ei"]
        cv_over = [f"rl.num_iterations={args.text_iterations}"]
        try:
            d_text = time_direct(_parameters(*cv, "text-direct", runs, cv_over, 1, extra))
            f_text, result = time_flow(_parameters(*cv, "text-flow", runs, cv_over, 1, extra))
            stages = max(int(result.get("stages", 1)), 1)
            per_stage = (f_text - d_text) / stages
            print(f"EI {args.text_iterations} iterations ({stages} stages): direct {d_text:.2f} s, "
                  f"flow {f_text:.2f} s, overhead per stage {per_stage:.3f} s")
        except UnknownTrainerError as e:
            print(f"EI run skipped: {e}")
    finally:
        if extra.get("openai_base_url"):
            api.stop()
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
    print(f"ppo_ratio={ppo_ratio:.4f} text_overhead_per_stage_s={per_stage:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

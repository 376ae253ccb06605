"""Orchestration overhead: the same training work directly and through the Prefect flows.

Starts a local ``prefect server`` on 127.0.0.1 and, for the text part, the local
OpenAI-compatible API server (their start-up times are printed and not counted), then runs
``--repeats`` interleaved repetitions (ABBA: direct, flow in even repetitions, flow, direct
in odd ones) of

* **PPO**: ``rl.num_iterations`` graph-isomorphism ``vanilla_ppo`` iterations, directly
  (``trainer.run_iterations(0, N)``) and through ``train_experiment`` (RL blocks of
  ``--block-size`` iterations, each a subflow run with its cached ``train_iterations``
  task). Timed: the training of those iterations only, i.e. ``run_iterations`` directly
  and ``flows.rl_blocks.drive_blocks`` (every block's subflow run, task, checkpoint and
  artifacts, which is the per-block overhead being measured) in the flow. Building the
  trainer (dataset, observation normalisation) and the final test loop are one-off and
  excluded in both modes. ``ppo_ratio = median(flow) / median(direct)``.
* **Text**: a ``code_validation`` ``pure_text_ei`` run of ``--text-iterations``
  iterations (32 rollouts per iteration, see :data:`TEXT_DEFAULTS`), directly
  (``trainer.train()``) and through ``train_experiment`` (one Prefect task per stage).

Both modes of a repetition get the same hyper-parameters and seed (``--seed``), a fresh
run id and a fresh run store, the same API server whose fine-tune jobs take a fixed wall
time (``--job-time-scale``: the server paces validating/queued/running at 25 s times the
scale whoever polls, the running phase at least 20 s times the scale, longer only if the
training itself takes longer; ``0.05`` makes a job about 1.25 s) and the same poll interval
(``--poll-interval``, no backoff). Only what the local server derives from a fine-tuned
model's name (which holds the run id) differs, so later iterations' sampled texts, not
their number, differ between runs. Before the repetitions, one untimed one-iteration run
in each mode pays the process's first-call costs (``--no-warmup`` skips it).

Text overhead per stage
-----------------------
The per-stage figure is not a difference of two runs (which noise can make negative); it
is measured on each stage of the flow run itself, with timers the benchmark wraps around
two nested calls on one monotonic clock (``time.perf_counter``):

* *task wall*: the call of ``flows.pure_text.run_stage_task`` (task run creation, state
  transitions, cache key, result persistence, the state re-read of ``tasks.stages``);
* *stage work*: ``PureTextRlTrainer.run_stage`` inside it (the stage function, summary and
  state writes, exactly what ``train()`` calls directly), minus the time spent in
  :class:`flows.observability.PrefectHooks` callbacks inside it (Prefect artifacts are
  orchestration, so they count as overhead).

``overhead = task wall - stage work``: the work interval lies inside the task interval, so
the difference cannot be negative (the benchmark checks it). Waiting for fine-tune jobs
happens inside the ``await_fine_tune_jobs`` stage's work, so it is excluded from the
overhead; it is reported separately. The figure printed is the median over all stages of
all repetitions, with its spread and the median of each stage kind.

Prefect's flow heartbeats are off as in ``nipflow run`` with a local server (each flow run
would otherwise wait about 1 s for its heartbeat thread); ``--heartbeats`` turns them on,
as deployed runs have them.

Usage::

    .venv/bin/python benchmarks/orchestration_overhead.py [--repeats 3] [--seed 8144]
        [--iterations 20] [--block-size 10] [--text-iterations 2] [--skip-ppo] [--skip-text]
        [--ppo-set KEY=VALUE ...] [--text-set KEY=VALUE ...] [--job-time-scale 0.05]
        [--poll-interval 0.05] [--heartbeats] [--no-warmup] [--json-out FILE]

A quick smoke run: ``--repeats 1 --iterations 1 --block-size 1 --ppo-set dataset=test
--ppo-set rl.frames_per_batch=16`` (what ``tests/test_benchmark_orchestration.py`` runs).
``--json-out`` writes every repetition's times and every stage's record (``task_s``,
``run_stage_s``, ``hooks_s``, ``work_s``, ``overhead_s``).

Last line: ``ppo_ratio=<float> text_overhead_per_stage_s=<float>`` followed by
``text_overhead_max_s`` (the largest stage overhead), ``text_stages`` (stage tasks
measured), ``text_ratio`` (median flow / median direct of the whole stage machine,
fine-tune waits included) and ``repeats``; ``nan`` for a skipped part.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterator

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

GI = ("graph_isomorphism", "vanilla_ppo")
CV = ("code_validation", "pure_text_ei")
#: The text run's size (``--text-set`` comes after, so it overrides these): enough examples
#: for a fine-tune job per group, a short test loop; the defaults (1000 rollouts) take minutes.
TEXT_DEFAULTS = ["rl.rollouts_per_iteration=32", "dataset_options.max_test_size=8", "rl.num_test_iterations=1"]


# -- servers -------------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_prefect_server(home: Path) -> tuple[subprocess.Popen, str, float]:
    """Start ``prefect server`` on a free loopback port; returns (process, API URL, start-up s)."""
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
            stop_process(proc)
            raise RuntimeError("prefect server did not start within 180 s")
        time.sleep(0.2)
    return proc, url, time.perf_counter() - t0


def stop_process(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=20)


# -- statistics ----------------------------------------------------------------------------------

def spread(values: list[float]) -> dict[str, float]:
    """Median, quartiles, min and max of ``values`` (all ``nan`` when empty)."""
    if not values:
        return dict(median=math.nan, q1=math.nan, q3=math.nan, min=math.nan, max=math.nan, n=0)
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else (values[0],) * 3
    return dict(median=statistics.median(values), q1=q1, q3=q3, min=min(values), max=max(values),
                n=len(values))


def describe(values: list[float], unit: str = "s") -> str:
    s = spread(values)
    if s["n"] == 0:
        return "no samples"
    return (f"median {s['median']:.3f} {unit} (IQR {s['q1']:.3f}-{s['q3']:.3f}, "
            f"min-max {s['min']:.3f}-{s['max']:.3f}, n={s['n']})")


# -- timers wrapped around the flows' and the trainer's calls ---------------------------------------

class Probe:
    """Timers around the calls the benchmark measures, installed for the whole benchmark.

    ``stages`` gets one record per ``PureTextRlTrainer.run_stage`` call: in a flow run, with
    the wall time of the ``run_stage_task`` call around it; directly, the work alone.
    ``spans`` gets the wall time of each ``drive_blocks`` / ``drive_stages`` call.
    """

    def __init__(self) -> None:
        self.stages: list[dict[str, Any]] = []
        self.spans: dict[str, list[float]] = {"drive_blocks": [], "drive_stages": []}
        self._task: dict[str, Any] | None = None  # the stage task being called, if any
        self._in_stage = False
        self._hooks_s = 0.0

    def take(self) -> tuple[list[dict[str, Any]], dict[str, list[float]]]:
        """The records since the last call (and forget them)."""
        stages, spans = self.stages, self.spans
        self.stages, self.spans = [], {k: [] for k in spans}
        return stages, spans

    @contextlib.contextmanager
    def installed(self) -> Iterator["Probe"]:
        import flows.pure_text
        import flows.rl_blocks
        from flows.observability import PrefectHooks
        from nip_core.trainers.pure_text_base import PureTextRlTrainer

        patches = [(flows.pure_text, "run_stage_task", self._wrap_task),
                   (flows.pure_text, "drive_stages", lambda f: self._wrap_span("drive_stages", f)),
                   (flows.rl_blocks, "drive_blocks", lambda f: self._wrap_span("drive_blocks", f)),
                   (PureTextRlTrainer, "run_stage", self._wrap_run_stage),
                   (PrefectHooks, "on_iteration_end", self._wrap_hook),
                   (PrefectHooks, "on_stage_end", self._wrap_hook)]
        saved = [(owner, name, owner.__dict__[name]) for owner, name, _ in patches]
        try:
            for owner, name, wrap in patches:
                setattr(owner, name, wrap(owner.__dict__[name]))
            yield self
        finally:
            for owner, name, original in saved:
                setattr(owner, name, original)

    def _wrap_span(self, key: str, fn: Callable) -> Callable:
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            result = fn(*args, **kwargs)
            self.spans[key].append(time.perf_counter() - t0)
            return result
        return timed

    def _wrap_task(self, fn: Callable) -> Callable:
        def timed(trainer, stage, iteration, **kwargs):
            self._task = {"iteration": int(iteration), "stage": str(stage), "work_s": None}
            t0 = time.perf_counter()
            try:
                result = fn(trainer, stage, iteration, **kwargs)
                task_s = time.perf_counter() - t0
                record = self._task
            finally:
                self._task = None
            record["task_s"] = task_s
            if record["work_s"] is None:  # not executed (cached or recovered): all of it is orchestration
                record.update(work_s=0.0, run_stage_s=0.0, hooks_s=0.0, executed=False)
            record["overhead_s"] = task_s - record["work_s"]
            if record["overhead_s"] < 0:
                raise RuntimeError(f"stage {record}: work longer than the task around it")
            self.stages.append(record)
            return result
        return timed

    def _wrap_run_stage(self, fn: Callable) -> Callable:
        probe = self

        def timed(trainer, stage):
            iteration = int(trainer.state.iteration)
            probe._in_stage, probe._hooks_s = True, 0.0
            t0 = time.perf_counter()
            try:
                result = fn(trainer, stage)
            finally:
                run_stage_s = time.perf_counter() - t0
                probe._in_stage = False
            record = {"run_stage_s": run_stage_s, "hooks_s": probe._hooks_s,
                      "work_s": run_stage_s - probe._hooks_s, "executed": True}
            if probe._task is not None:
                probe._task.update(record)
            else:
                probe.stages.append({"iteration": iteration, "stage": str(stage), **record})
            return result
        return timed

    def _wrap_hook(self, fn: Callable) -> Callable:
        probe = self

        def timed(hooks, *args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(hooks, *args, **kwargs)
            finally:
                if probe._in_stage:
                    probe._hooks_s += time.perf_counter() - t0
        return timed


# -- one run in each mode --------------------------------------------------------------------------

def experiment_parameters(kind: tuple[str, str], run_id: str, runs_dir: Path, seed: int, overrides: list[str],
                          block_size: int | None, settings: dict[str, Any]):
    from flows.form_fields import DEFAULT_BLOCK_SIZE
    from flows.parameters import ExperimentParameters

    return ExperimentParameters(scenario=kind[0], trainer=kind[1], run_id=run_id, runs_dir=str(runs_dir),
                                seed=seed, overrides=overrides, block_size=block_size or DEFAULT_BLOCK_SIZE,
                                wait_mode="poll", settings_overrides=settings)


def run_direct(parameters, probe: Probe) -> tuple[float, list[dict[str, Any]]]:
    """Build the trainer (not timed), then time its training: ``run_iterations`` or ``train()``."""
    from nip_core.trainers import build_trainer

    hp = parameters.hyper_params()
    trainer = build_trainer(hp, parameters.settings(hp))
    try:
        probe.take()
        t0 = time.perf_counter()
        if hp.scenario == GI[0]:
            trainer.run_iterations(0, hp.rl.num_iterations)
        else:
            trainer.train()
        elapsed = time.perf_counter() - t0
    finally:
        trainer.close()
    return elapsed, probe.take()[0]


def run_flow(parameters, probe: Probe, heartbeats: bool) -> tuple[float, list[dict[str, Any]]]:
    """``train_experiment``; the time of its ``drive_blocks`` / ``drive_stages`` call."""
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    from flows.experiment import train_experiment

    probe.take()
    updates = {} if heartbeats else {PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}
    with temporary_settings(updates=updates):
        state = train_experiment(**parameters.flow_parameters(), return_state=True)
    if not state.is_completed():
        raise RuntimeError(f"run {parameters.run_id}: flow run ended {state.name}: {state.message}")
    stages, spans = probe.take()
    key = "drive_blocks" if parameters.scenario == GI[0] else "drive_stages"
    if len(spans[key]) != 1:
        raise RuntimeError(f"run {parameters.run_id}: expected one {key} call, timed {len(spans[key])}")
    return spans[key][0], stages


# -- the benchmark ---------------------------------------------------------------------------------

def _order(rep: int) -> tuple[str, str]:
    return ("direct", "flow") if rep % 2 == 0 else ("flow", "direct")


def run_pairs(name: str, args, kind: tuple[str, str], overrides: list[str], settings: dict[str, Any],
              block_size: int | None, work: Path, probe: Probe, repeats: int, tag: str = "") -> list[dict]:
    """``repeats`` interleaved (ABBA) direct/flow runs; one dict per repetition."""
    reps = []
    for rep in range(repeats):
        row: dict[str, Any] = {"rep": rep}
        for mode in _order(rep):
            run_id = f"{name}{tag}-{mode}-{rep}"
            params = experiment_parameters(kind, run_id, work / "runs" / run_id, args.seed, overrides,
                                           block_size, settings)
            if mode == "direct":
                row["direct_s"], row["direct_stages"] = run_direct(params, probe)
            else:
                row["flow_s"], row["flow_stages"] = run_flow(params, probe, args.heartbeats)
        reps.append(row)
    return reps


def report_ppo(reps: list[dict]) -> float:
    for r in reps:
        print(f"  rep {r['rep'] + 1} ({'/'.join(_order(r['rep']))}): direct {r['direct_s']:.2f} s, "
              f"flow {r['flow_s']:.2f} s, ratio {r['flow_s'] / r['direct_s']:.3f}")
    direct, flow = [r["direct_s"] for r in reps], [r["flow_s"] for r in reps]
    ratio = statistics.median(flow) / statistics.median(direct)
    print(f"PPO direct: {describe(direct)}")
    print(f"PPO flow:   {describe(flow)}")
    print(f"PPO ratio (median flow / median direct): {ratio:.3f}  (target <= 1.10)")
    return ratio


def report_text(reps: list[dict]) -> dict[str, float]:
    overheads, by_stage, waits = [], {}, []
    for r in reps:
        executed = [s for s in r["flow_stages"] if s["executed"]]
        rep_over = [s["overhead_s"] for s in r["flow_stages"]]
        overheads += rep_over
        for s in r["flow_stages"]:
            by_stage.setdefault(s["stage"], []).append(s["overhead_s"])
        waits += [s["work_s"] for s in r["flow_stages"] if s["stage"] == "await_fine_tune_jobs"]
        print(f"  rep {r['rep'] + 1} ({'/'.join(_order(r['rep']))}): direct {r['direct_s']:.2f} s "
              f"({len(r['direct_stages'])} stages), flow {r['flow_s']:.2f} s ({len(r['flow_stages'])} stage "
              f"tasks, {len(executed)} executed); overhead per stage {describe(rep_over)}")
    print(f"text overhead per stage (task wall - stage work), all stages: {describe(overheads)}")
    for stage, values in by_stage.items():
        print(f"  {stage:<22} {describe(values)}")
    direct_work = [s["work_s"] for r in reps for s in r["direct_stages"]]
    flow_work = [s["work_s"] for r in reps for s in r["flow_stages"]]
    print(f"stage work, direct: {describe(direct_work)}")
    print(f"stage work, flow:   {describe(flow_work)}")
    print(f"fine-tune wait (await_fine_tune_jobs work, excluded from the overhead): {describe(waits)}")
    direct, flow = [r["direct_s"] for r in reps], [r["flow_s"] for r in reps]
    print(f"text run direct: {describe(direct)}; flow (stage machine): {describe(flow)}")
    s = spread(overheads)
    return {"median": s["median"], "max": s["max"], "n": s["n"],
            "ratio": statistics.median(flow) / statistics.median(direct) if reps else math.nan}


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3, help="interleaved direct/flow repetitions (default 3)")
    ap.add_argument("--seed", type=int, default=8144, help="seed of every run (default 8144)")
    ap.add_argument("--iterations", type=int, default=20, help="PPO iterations per run (default 20)")
    ap.add_argument("--block-size", type=int, default=10, help="PPO iterations per RL block (default 10)")
    ap.add_argument("--text-iterations", type=int, default=2, help="text iterations per run (default 2)")
    ap.add_argument("--ppo-set", action="append", default=[], metavar="KEY=VALUE",
                    help="extra PPO hyper-parameter override, both modes (repeatable)")
    ap.add_argument("--text-set", action="append", default=[], metavar="KEY=VALUE",
                    help="extra text hyper-parameter override, both modes (repeatable)")
    ap.add_argument("--skip-ppo", action="store_true", help="do not time the PPO runs")
    ap.add_argument("--skip-text", action="store_true", help="do not time the text runs")
    ap.add_argument("--job-time-scale", type=float, default=0.05,
                    help="the local server's fine-tune job pacing: a job takes 25 s times this (default 0.05)")
    ap.add_argument("--poll-interval", type=float, default=0.05,
                    help="fine-tune poll interval in seconds, fixed (no backoff), both modes (default 0.05)")
    ap.add_argument("--heartbeats", action="store_true", help="keep Prefect's flow-run heartbeats on")
    ap.add_argument("--no-warmup", dest="warmup", action="store_false",
                    help="skip the untimed one-iteration run in each mode before the repetitions")
    ap.add_argument("--json-out", type=Path, help="also write every measurement to this JSON file")
    args = ap.parse_args(argv)
    for field in ("repeats", "iterations", "block_size", "text_iterations"):
        if getattr(args, field) < 1:
            ap.error(f"--{field.replace('_', '-')} must be at least 1, got {getattr(args, field)}")
    for field in ("job_time_scale", "poll_interval"):
        if not getattr(args, field) > 0:
            ap.error(f"--{field.replace('_', '-')} must be positive, got {getattr(args, field)}")
    for item in args.ppo_set + args.text_set:
        if "=" not in item:
            ap.error(f"--ppo-set/--text-set take KEY=VALUE, got {item!r}")
    if args.skip_ppo and args.skip_text:
        ap.error("--skip-ppo and --skip-text together leave nothing to measure")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="nipflow-bench-"))
    server, url, startup = start_prefect_server(work / "prefect-home")
    print(f"prefect server start-up (not counted): {startup:.2f} s ({url})")
    os.environ.update(PREFECT_API_URL=url, PREFECT_HOME=str(work / "client-home"),
                      PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_LOGGING_LEVEL="WARNING")
    api = None
    results: dict[str, Any] = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}}
    ppo_ratio, text = math.nan, {"median": math.nan, "max": math.nan, "n": 0, "ratio": math.nan}
    try:
        import torch

        torch.set_num_threads(1)
        import logging

        logging.getLogger("httpx").setLevel(logging.WARNING)
        with Probe().installed() as probe:
            if not args.skip_ppo:
                over = [f"rl.num_iterations={args.iterations}", *args.ppo_set]
                if args.warmup:
                    run_pairs("ppo", args, GI, [*over, "rl.num_iterations=1"], {}, 1, work, probe, 1, "-warmup")
                reps = run_pairs("ppo", args, GI, over, {}, args.block_size, work, probe, args.repeats)
                print(f"PPO: {args.iterations} iterations, blocks of {args.block_size}, {args.repeats} repetition(s)")
                ppo_ratio = report_ppo(reps)
                results["ppo"] = reps
            if not args.skip_text:
                from nipflow_llm_server.launcher import LocalApiServer

                t0 = time.perf_counter()
                api = LocalApiServer(work / "api", job_time_scale=args.job_time_scale)
                api.start()
                print(f"API server start-up (not counted): {time.perf_counter() - t0:.2f} s; fine-tune jobs "
                      f"take {25 * args.job_time_scale:.2f} s of pacing, polled every {args.poll_interval} s")
                settings = {"openai_base_url": api.base_url, "fine_tune_poll_interval_s": args.poll_interval,
                            "fine_tune_poll_max_interval_s": args.poll_interval}
                over = [*TEXT_DEFAULTS, f"rl.num_iterations={args.text_iterations}", *args.text_set]
                if args.warmup:
                    run_pairs("text", args, CV, [*over, "rl.num_iterations=1"], settings, None, work, probe, 1,
                              "-warmup")
                reps = run_pairs("text", args, CV, over, settings, None, work, probe, args.repeats)
                print(f"text: {args.text_iterations} iterations, {args.repeats} repetition(s)")
                text = report_text(reps)
                results["text"] = reps
    finally:
        if api is not None:
            api.stop()
        stop_process(server)
        shutil.rmtree(work, ignore_errors=True)  # run stores and Prefect's database (--json-out keeps the figures)
    if args.json_out:
        args.json_out.write_text(json.dumps(results, indent=1))
    print(f"ppo_ratio={ppo_ratio:.4f} text_overhead_per_stage_s={text['median']:.4f} "
          f"text_overhead_max_s={text['max']:.4f} text_stages={text['n']} text_ratio={text['ratio']:.4f} "
          f"repeats={args.repeats}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

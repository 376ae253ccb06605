"""Rollout throughput of the pure-text trainers against the local OpenAI-compatible server.

Starts a local server on a free loopback port whose every chat completion takes
``--latency-ms`` (default 200 ms, standing in for a remote API), builds the code-validation
scenario (nip protocol) and samples the same rollouts with the trainer's own sampler
(:func:`nip_core.trainers.pure_text_rollouts.run_episodes`, one thread per concurrent
episode, one shared ``openai`` client) at concurrency 1 and 32. Prints rollouts per second
at each level and the speedup. Last line: ``c1=<float> c32=<float> speedup=<float>``.
Target: speedup >= 20.

    .venv/bin/python benchmarks/text_rollouts.py [--latency-ms 200] [--rollouts-c1 8] [--rollouts-c32 128]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import nip_core.trainers.catalogue  # noqa: E402,F401
from nipflow_llm_server.launcher import LocalApiServer  # noqa: E402
from nip_core.parameters import HyperParameters  # noqa: E402
from nip_core.scenarios.registry import build_scenario_instance  # noqa: E402
from nip_core.settings import ExperimentSettings  # noqa: E402
from nip_core.trainers.pure_text_rollouts import TextActor, datapoint_indices, run_episodes, stable_seed  # noqa: E402


def measure(scenario, hp, count: int, concurrency: int) -> tuple[float, int]:
    """Rollouts per second sampling ``count`` rollouts ``concurrency`` at a time, and API calls made."""
    env, ds = scenario.train_environment, scenario.train_dataset
    indices = datapoint_indices(hp.seed, len(ds), 0, count)
    seeds = [stable_seed(hp.seed, "bench", k, modulus=2**16) for k in range(count)]
    actor = TextActor(env, scenario.whole_agents(), hp.interaction_protocol, hp)
    t0 = time.perf_counter()
    rollouts = run_episodes(env, actor, ds, indices, seeds, concurrency)
    elapsed = time.perf_counter() - t0
    assert len(rollouts) == count
    return count / elapsed, actor.tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--latency-ms", type=float, default=200.0)
    ap.add_argument("--rollouts-c1", type=int, default=8)
    ap.add_argument("--rollouts-c32", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=4, help="nip_protocol.max_message_rounds")
    args = ap.parse_args()

    hp = HyperParameters(scenario="code_validation", trainer="pure_text_ei", dataset="nipflow-cv",
                         interaction_protocol="nip", nip_protocol={"max_message_rounds": args.rounds})
    with tempfile.TemporaryDirectory() as tmp:
        server = LocalApiServer(Path(tmp) / "api", latency_ms=args.latency_ms)
        server.start()
        try:
            settings = ExperimentSettings(use_wandb=False, runs_dir=str(Path(tmp) / "runs"),
                                          openai_base_url=server.base_url, show_progress=False)
            scenario = build_scenario_instance(hp, settings)
            measure(scenario, hp, 2, 2)  # warm-up: client, connections, prompt templates
            c1, _ = measure(scenario, hp, args.rollouts_c1, 1)
            print(f"concurrency 1:  {c1:8.2f} rollouts/s ({args.rollouts_c1} rollouts, "
                  f"latency {args.latency_ms:.0f} ms per call)", flush=True)
            c32, _ = measure(scenario, hp, args.rollouts_c32, 32)
            print(f"concurrency 32: {c32:8.2f} rollouts/s ({args.rollouts_c32} rollouts)", flush=True)
        finally:
            server.stop()
    print(f"c1={c1:.3f} c32={c32:.3f} speedup={c32 / c1:.2f}")


if __name__ == "__main__":
    main()

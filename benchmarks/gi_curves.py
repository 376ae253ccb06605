"""Learning curves of GI PPO with the paper's agents, and the same curves under a git ref's code.

A speed change must not change what training does. This trains the agents of
``benchmarks/gi_ppo.py``'s paper workload (nip's grid: tanh GIN, one transformer layer,
separate policy and value bodies, Adam) at a size that learns in a minute on one CPU
thread — 256 frames per iteration, 4 epochs of minibatches of 64, ``lr`` 3e-3, random
graph pairs of 7-11 nodes — and prints per iteration the verifier's and the prover's mean
episode reward and the PPO objective, then the verifier's mean episode reward on held-out
pairs (statistics that mean the same in older code, so a ref can be compared).

``--baseline REF`` runs the same through REF's code (a temporary worktree, the same
interpreter, :mod:`same_run_baseline`) and prints both curves side by side. Equal code
gives equal curves; code that differs only in float rounding gives curves that agree at
first and then drift apart within the spread of seeds (``--seed`` to see that spread),
ending at the same reward. The last line::

    final_test_reward=<float> [baseline_final_test_reward=<float>]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from same_run_baseline import REPO, RESULT_PREFIX, cpu_model, run_child, worktree  # noqa: E402

import torch  # noqa: E402

from gi_ppo import build_trainer  # noqa: E402

# statistics whose names and meanings are the same in the code of every ref worth comparing with
CURVE_KEYS = ("verifier.mean_episode_reward", "prover.mean_episode_reward", "loss_objective")
TEST_KEY = "verifier.test_mean_episode_reward"


def curves(iterations: int, seed: int) -> dict:
    """Per-iteration :data:`CURVE_KEYS` and the final held-out :data:`TEST_KEY`."""
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = build_trainer(tmp, device="cpu", seed=seed, frames_per_batch=256, minibatch_size=64,
                                num_epochs=4, lr=3e-3)
        rows: list[dict[str, float]] = []
        run_iteration = trainer._train_iteration

        def logged_iteration(iteration: int) -> dict[str, float]:
            stats = run_iteration(iteration)
            rows.append({key: float(stats[key]) for key in CURVE_KEYS})
            return stats

        trainer._train_iteration = logged_iteration
        trainer.run_iterations(0, iterations)
        test = trainer.test()
    return {"rows": rows, "test_reward": float(test[TEST_KEY])}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--seed", type=int, default=8144)
    parser.add_argument("--baseline", metavar="REF", default=None, help="also train with this git ref's code")
    parser.add_argument("--result-line", action="store_true", help=argparse.SUPPRESS)  # child of --baseline
    args = parser.parse_args(argv)
    if args.result_line:
        print(RESULT_PREFIX + json.dumps(curves(args.iterations, args.seed)))
        return
    child_argv = ["--iterations", str(args.iterations), "--seed", str(args.seed)]
    print(f"CPU: {cpu_model()}", flush=True)
    sides = {"current": run_child(Path(__file__).resolve(), child_argv, REPO)}
    if args.baseline is not None:
        with worktree(args.baseline) as tree:
            sides[args.baseline] = run_child(Path(__file__).resolve(), child_argv, tree)
    header = " | ".join(f"{side}: {key}" for side in sides for key in CURVE_KEYS)
    print(f"| iteration | {header} |")
    print("|---|" + "---|" * (len(sides) * len(CURVE_KEYS)))
    for i in range(args.iterations):
        cells = " | ".join(f"{result['rows'][i][key]:.4f}" for result in sides.values() for key in CURVE_KEYS)
        print(f"| {i} | {cells} |")
    print("held-out verifier reward: " + ", ".join(f"{side} {r['test_reward']:.3f}" for side, r in sides.items()))
    line = f"final_test_reward={sides['current']['test_reward']:.4f}"
    if args.baseline is not None:
        line += f" baseline_final_test_reward={sides[args.baseline]['test_reward']:.4f}"
    print(line)


if __name__ == "__main__":
    main()

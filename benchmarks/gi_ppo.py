"""Benchmark: vanilla PPO on graph isomorphism with the original paper's configuration.

Runs ``--iterations`` training iterations on one CPU thread (or on ``--device cuda``;
``auto``, the default, picks CUDA when there is one) in ``--precision`` fp32 or bf16, and
prints the device, the time of each phase of an iteration (collection, GAE, update) and
then seconds per iteration, frames per second and peak RSS; the last line is
machine-readable::

    s_per_iter=<float> frames_per_s=<float> peak_rss_mb=<int>

``--compile MODE`` runs the loss's forward pass of every minibatch step through
``torch.compile(mode=MODE)`` (``reduce-overhead`` replays CUDA graphs on a GPU; on a CPU
compiling costs minutes).

``--baseline REF`` (a git ref) measures REF's code on the same workload in the same run
(:mod:`same_run_baseline`: a temporary worktree, the same interpreter, ABBA order,
``--repetitions`` measurements of each side) and ends with
``s_per_iter=… frames_per_s=… peak_rss_mb=… speedup_vs_REF=…`` (the current code's means;
the speed-up is the baseline's mean time over the current one's, its spread printed above).

Uses the ``eru10000`` dataset (nip's grid) when ``nip_core.scenarios.graph_isomorphism.dataset`` can
provide it (``--data-dir``), else an in-memory set of random Erdős–Rényi pairs of 7–11
nodes (the timing depends only on the sizes, not on the labels).
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from same_run_baseline import RESULT_PREFIX, code_root, compare, cpu_model, speedup  # noqa: E402

sys.path.insert(0, str(code_root()))  # this checkout's nip_core, or a baseline worktree's

import json  # noqa: E402

import torch  # noqa: E402
from tensordict import TensorDict  # noqa: E402

import nip_core  # noqa: E402

from nip_core.parameters import HyperParameters  # noqa: E402
from nip_core.scenarios.graph_isomorphism.build import build_graph_isomorphism  # noqa: E402
from nip_core.settings import ExperimentSettings  # noqa: E402
from nip_core.trainers.vanilla_ppo import VanillaPpoTrainer  # noqa: E402


def paper_params(seed: int = 8144) -> HyperParameters:
    """The grid of nip's ``scripts/ppo_gi.py``, field by field (``tests/test_benchmark_paper_params.py``).

    Fields the grid does not set stay at nip's defaults, which are nipflow's. The grid's
    ``spg_variant`` ("spg") is not set: vanilla_ppo never reads ``spg.*``, and nipflow refuses a
    value in a field the trainer does not read (docs/behaviour.md#b43), so it cannot change the
    workload.
    """
    common = dict(num_transformer_layers=1, num_heads=4, d_transformer=16, d_transformer_mlp=64, d_gnn=16,
                  d_gin_mlp=64, d_value=16, num_value_layers=2, activation_function="tanh",
                  use_orthogonal_initialisation=True, use_dual_gnn=False, use_batch_norm=False)
    return HyperParameters(
        scenario="graph_isomorphism", trainer="vanilla_ppo", dataset="eru10000", interaction_protocol="nip",
        seed=seed,
        agents={"prover": {**common, "num_gnn_layers": 5}, "verifier": {**common, "num_gnn_layers": 2}},
        rl=dict(frames_per_batch=2048, num_iterations=5000, num_epochs=10, minibatch_size=256, lr=3e-4,
                gamma=0.95, lmbda=0.95, max_grad_norm=0.5, normalize_observations=True, use_shared_body=False,
                loss_critic_type="smooth_l1"),
        ppo=dict(clip_epsilon=0.2, entropy_eps=0.001, normalize_advantage=True),
        protocol_common=dict(verifier_first=True, verifier_no_guess_reward=0.05, verifier_terminated_penalty=-1.0),
        nip_protocol=dict(min_message_rounds=3, max_message_rounds=8),
    )


class RandomPairs:
    """Random ER pairs with 7-11 nodes (half isomorphic by relabelling)."""

    def __init__(self, n: int = 1000, seed: int = 0, max_nodes: int = 11):
        g = torch.Generator().manual_seed(seed)
        self.max_nodes = max_nodes
        adjacency = torch.zeros(n, 2, max_nodes, max_nodes, dtype=torch.int32)
        node_mask = torch.zeros(n, 2, max_nodes, dtype=torch.bool)
        y = torch.arange(n) % 2
        for i in range(n):
            size = int(torch.randint(7, max_nodes + 1, (1,), generator=g))
            p = [0.2, 0.4, 0.6, 0.8][i % 4]
            a = (torch.rand(size, size, generator=g) < p).int().triu(1)
            a = a + a.T
            if y[i]:
                perm = torch.randperm(size, generator=g)
                b = a[perm][:, perm]
            else:
                b = (torch.rand(size, size, generator=g) < p).int().triu(1)
                b = b + b.T
            adjacency[i, 0, :size, :size], adjacency[i, 1, :size, :size] = a, b
            node_mask[i, :, :size] = True
        self.data = TensorDict({"adjacency": adjacency, "node_mask": node_mask, "y": y}, batch_size=(n,))

    def __len__(self) -> int:
        return self.data.batch_size[0]

    def __getitem__(self, index):
        return self.data[index]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--data-dir", default=None, help="where named datasets live (else random pairs)")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="rl.precision")
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (CUDA when available)")
    parser.add_argument("--compile", default=None, choices=["default", "reduce-overhead", "max-autotune"],
                        help="torch.compile mode of the minibatch step's loss forward (default: eager)")
    parser.add_argument("--workload", choices=["paper", "tiny"], default="paper",
                        help="paper: nip's grid (the figures to report); tiny: 64 frames, one epoch "
                             "(checks that the benchmark runs)")
    parser.add_argument("--baseline", metavar="REF", default=None,
                        help="also measure this git ref's code on the same workload, interleaved")
    parser.add_argument("--repetitions", type=int, default=2,
                        help="with --baseline: measurements of each side (ABBA order, default 2)")
    parser.add_argument("--result-line", action="store_true", help=argparse.SUPPRESS)  # child of --baseline
    args = parser.parse_args(argv)
    if args.repetitions < 1:
        parser.error(f"--repetitions must be at least 1, got {args.repetitions}")
    if args.baseline is not None:
        compare_with_baseline(args, argv if argv is not None else sys.argv[1:])
        return
    measure(args)


def compare_with_baseline(args, argv: list[str]) -> None:
    child_argv = []
    skip = False
    for item in argv:  # the same options, without --baseline/--repetitions
        if skip:
            skip = False
            continue
        if item in ("--baseline", "--repetitions"):
            skip = True
            continue
        if not item.startswith(("--baseline=", "--repetitions=")):
            child_argv.append(item)
    print(f"CPU: {cpu_model()}", flush=True)
    current, baseline = compare(Path(__file__).resolve(), child_argv, args.baseline, args.repetitions)
    ratio, low, high = speedup([r["s_per_iter"] for r in current], [r["s_per_iter"] for r in baseline])
    s_per_iter = sum(r["s_per_iter"] for r in current) / len(current)
    base_s = sum(r["s_per_iter"] for r in baseline) / len(baseline)
    print(f"current {s_per_iter:.3f} s/iteration, {args.baseline} {base_s:.3f} s/iteration "
          f"({args.repetitions} each, ABBA): speed-up {ratio:.2f}x (pairs {low:.2f}x to {high:.2f}x)")
    print(f"s_per_iter={s_per_iter:.3f} frames_per_s={current[0]['frames'] / s_per_iter:.1f} "
          f"peak_rss_mb={max(r['peak_rss_mb'] for r in current)} speedup_vs_{args.baseline}={ratio:.3f}")


def build_trainer(tmp: str, *, workload: str = "paper", precision: str = "fp32", device: str = "auto",
                  data_dir: str | None = None, seed: int = 8144, **rl: object) -> VanillaPpoTrainer:
    """The benchmark's trainer (no run store) on ``workload``; ``rl`` overrides ``rl.*`` fields."""
    hp = paper_params(seed)
    rl_update = {"precision": precision, **rl}
    if workload == "tiny":
        rl_update.update(frames_per_batch=64, num_epochs=1, minibatch_size=32, num_normalization_steps=2)
    hp = hp.model_copy(update={"rl": hp.rl.model_copy(update=rl_update)})
    settings = ExperimentSettings(use_wandb=False, runs_dir=tmp, data_dir=data_dir or tmp,
                                  show_progress=False, device=device)
    datasets = {}
    if data_dir is None:
        datasets = dict(train_dataset=RandomPairs(seed=0), test_dataset=RandomPairs(seed=1))
    scenario = build_graph_isomorphism(hp, settings, **datasets)
    return VanillaPpoTrainer(hp, settings=settings, scenario_instance=scenario)


def measure(args) -> None:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        trainer = build_trainer(tmp, workload=args.workload, precision=args.precision, device=args.device,
                                data_dir=args.data_dir)
        trainer.compile_mode = args.compile
        setup_s = time.perf_counter() - start
        phases: list[dict[str, float]] = []
        run_iteration = trainer._train_iteration

        def timed_iteration(iteration: int) -> dict[str, float]:
            stats = run_iteration(iteration)
            phases.append({k: v for k, v in stats.items() if k.startswith("time_")})
            return stats

        trainer._train_iteration = timed_iteration
        trainer.run_iterations(0, 1)  # warm-up (allocations, first-call overheads, compilation)
        phases.clear()
        start, cpu_start = time.perf_counter(), time.process_time()
        trainer.run_iterations(1, 1 + args.iterations)
        elapsed, cpu_elapsed = time.perf_counter() - start, time.process_time() - cpu_start
    s_per_iter = elapsed / args.iterations
    frames_per_s = trainer.frames_per_batch / s_per_iter
    peak_rss_mb = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    print(f"CPU: {cpu_model()}")
    print(f"device: {trainer.settings.device}"
          + (f" ({torch.cuda.get_device_name(trainer.settings.device)})" if trainer._computes_on_cuda() else "")
          + f", precision: {args.precision}, compile: {args.compile or 'eager'}, torch threads: "
          f"{torch.get_num_threads()}")
    print(f"setup (incl. observation-normalisation rollouts): {setup_s:.2f} s")
    for phase in sorted({k for p in phases for k in p}):
        mean = sum(p.get(phase, 0.0) for p in phases) / max(len(phases), 1)
        print(f"phase {phase[len('time_'):-len('_s')]}: {mean:.3f} s/iteration")
    print(f"{args.iterations} iterations of {trainer.frames_per_batch} frames in {elapsed:.2f} s "
          f"(process CPU time {cpu_elapsed:.2f} s)")
    print(f"s_per_iter={s_per_iter:.3f} frames_per_s={frames_per_s:.1f} peak_rss_mb={peak_rss_mb}")
    if args.result_line:
        print(RESULT_PREFIX + json.dumps({"s_per_iter": s_per_iter, "peak_rss_mb": peak_rss_mb,
                                          "frames": trainer.frames_per_batch,
                                          # where nip_core really came from (not where it was asked for)
                                          "code_root": str(Path(nip_core.__file__).resolve().parents[1])}))


if __name__ == "__main__":
    main()

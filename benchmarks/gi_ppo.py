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

Uses the ``er10000`` dataset when ``nip_core.scenarios.graph_isomorphism.dataset`` can
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from tensordict import TensorDict  # noqa: E402

from nip_core.parameters import HyperParameters  # noqa: E402
from nip_core.scenarios.graph_isomorphism.build import build_graph_isomorphism  # noqa: E402
from nip_core.settings import ExperimentSettings  # noqa: E402
from nip_core.trainers.vanilla_ppo import VanillaPpoTrainer  # noqa: E402


def paper_params(seed: int = 8144) -> HyperParameters:
    common = dict(num_transformer_layers=1, num_heads=4, d_transformer=16, d_transformer_mlp=64, d_gnn=16,
                  d_gin_mlp=64, d_value=16, num_value_layers=2, activation_function="tanh",
                  use_orthogonal_initialisation=True)
    return HyperParameters(
        scenario="graph_isomorphism", trainer="vanilla_ppo", dataset="er10000", interaction_protocol="nip",
        seed=seed,
        agents={"prover": {**common, "num_gnn_layers": 5}, "verifier": {**common, "num_gnn_layers": 2}},
        rl=dict(frames_per_batch=2048, num_epochs=10, minibatch_size=256, lr=3e-4, gamma=0.95, lmbda=0.95,
                normalize_observations=True, use_shared_body=False, loss_critic_type="smooth_l1"),
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
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    hp = paper_params()
    hp = hp.model_copy(update={"rl": hp.rl.model_copy(update={"precision": args.precision})})
    with tempfile.TemporaryDirectory() as tmp:
        settings = ExperimentSettings(use_wandb=False, runs_dir=tmp, data_dir=args.data_dir or tmp,
                                      show_progress=False, device=args.device)
        datasets = {}
        if args.data_dir is None:
            datasets = dict(train_dataset=RandomPairs(seed=0), test_dataset=RandomPairs(seed=1))
        scenario = build_graph_isomorphism(hp, settings, **datasets)
        start = time.perf_counter()
        trainer = VanillaPpoTrainer(hp, settings, scenario_instance=scenario)
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


if __name__ == "__main__":
    main()

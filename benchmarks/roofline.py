"""Roofline of a GI PPO minibatch step: this machine's limits and where the step stands.

Measures, on one torch thread:

* memory bandwidth with a STREAM-like triad (``a = b + s * c`` over three arrays far larger
  than the caches; bytes counted as STREAM does: two reads and one write per element);
* the GEMM peak in fp32 and bf16 (square products large enough to be compute-bound);
* one iteration's update phase of ``benchmarks/gi_ppo.py``'s paper workload (``rl.num_epochs``
  set to 1 while profiling: its minibatch steps are the same), under ``torch.profiler``:
  every ``aten`` op's own time and FLOPs (the profiler's count, matrix products only), and
  the bytes of each op that moves data (not views, not wrappers whose child ops do the
  work): its inputs, from the recorded shapes and dtypes, plus what it allocates (its
  outputs). In-place ops' writes and reductions' reads are approximations.

and prints, per minibatch step, the FLOPs and bytes, the lower bound
``max(FLOPs / GEMM peak, bytes / bandwidth)`` summed op by op, the measured time, and a table
of the ops by measured time with each op's bound. The last line is machine-readable::

    triad_gb_s=<float> gemm_fp32_gflop_s=<float> gemm_bf16_gflop_s=<float> step_ms=<float> bound_ms=<float>

The bound is optimistic on purpose (every op at the machine's best rate, no overhead
between ops): it says how far the code could go without changing the workload.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from gi_ppo import build_trainer  # noqa: E402
from same_run_baseline import cpu_model  # noqa: E402

from nip_core.utils.cpu import cpu_has_native_bf16  # noqa: E402

DTYPE_BYTES = {"float": 4, "c10::BFloat16": 2, "c10::Half": 2, "double": 8, "long int": 8, "int": 4,
               "bool": 1, "unsigned char": 1, "signed char": 1, "short int": 2}


def best_time(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def triad_bandwidth(n: int = 1 << 24) -> float:
    """Bytes per second of ``a = b + 3 c`` over ``n``-element float32 arrays (3 x 64 MiB by default)."""
    a, b, c = torch.empty(n), torch.rand(n), torch.rand(n)
    seconds = best_time(lambda: torch.add(b, c, alpha=3.0, out=a), repeats=10)
    return 3 * n * 4 / seconds


def gemm_peak(dtype: torch.dtype, n: int = 1024) -> float:
    """FLOP/s of an ``n x n`` by ``n x n`` product in ``dtype``."""
    x, y = torch.rand(n, n).to(dtype), torch.rand(n, n).to(dtype)
    seconds = best_time(lambda: torch.mm(x, y), repeats=5)
    return 2 * n ** 3 / seconds


# ops that only make views or metadata: no bytes move
METADATA_OPS = {f"aten::{name}" for name in (
    "view", "reshape", "as_strided", "expand", "expand_as", "permute", "transpose", "t", "unsqueeze", "squeeze",
    "select", "slice", "_unsafe_view", "alias", "detach", "detach_", "resolve_conj", "resolve_neg", "empty",
    "empty_strided", "empty_like", "unbind", "split", "split_with_sizes", "chunk", "narrow", "view_as",
    "lift_fresh", "_reshape_alias", "unflatten", "flatten", "numpy_T", "contiguous", "to", "_to_copy_",
    "result_type", "is_nonzero", "item", "_local_scalar_dense", "set_", "resize_", "lift", "movedim")}


# ops that hand their work to child ops (counted there)
COMPOSITE_OPS = {f"aten::{name}" for name in (
    "linear", "matmul", "clone", "_to_copy", "layer_norm", "softmax", "log_softmax", "einsum", "dropout",
    "where", "masked_fill", "index", "gather_backward", "embedding", "cross_entropy_loss", "nll_loss_nd",
    "smooth_l1_loss", "mse_loss", "zeros", "ones", "full", "zeros_like", "ones_like", "full_like", "new_zeros",
    "new_full", "new_empty", "stack", "sum_to_size", "type_as", "repeat", "one_hot")}


def _does_work(event) -> bool:
    """An op whose inputs and outputs are memory traffic of the step (not a view, not a wrapper)."""
    return event.name.startswith("aten::") and event.name not in METADATA_OPS | COMPOSITE_OPS


def _input_bytes(event) -> int:
    total = 0
    for shape, dtype in zip(event.input_shapes or [], event.input_dtypes or []):
        if isinstance(shape, list) and shape and all(isinstance(d, int) for d in shape):
            count = 1
            for d in shape:
                count *= d
            total += count * DTYPE_BYTES.get(dtype, 4)
    return total


def profile_update(precision: str, workload: str = "paper") -> tuple[dict[str, dict[str, float]], float, int]:
    """Per leaf op ``{count, ms, flops, bytes}`` of one update phase; its wall ms; its step count."""
    with tempfile.TemporaryDirectory() as tmp:
        trainer = build_trainer(tmp, workload=workload, precision=precision, device="cpu", num_epochs=1)
        with torch.no_grad(), trainer._precision():
            batch, trainer._carried_td = trainer.train_collector.collect(trainer._carried_td)
            trainer._add_values_and_advantages(batch)
        active = {name: True for name in trainer.agent_names}

        def update():
            trainer.replay_buffer = trainer._get_replay_buffer()
            trainer.replay_buffer.extend(trainer.loss_module.minibatch_source(batch).reshape(-1))  # as the trainer
            trainer.active_agents = active
            trainer._train_on_replay_buffer()

        update()  # warm-up
        start = time.perf_counter()
        update()
        wall_ms = (time.perf_counter() - start) * 1e3
        steps = trainer.frames_per_batch // trainer.hyper_params.rl.minibatch_size
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_flops=True,
                     profile_memory=True) as prof:
            update()
    ops: dict[str, dict[str, float]] = defaultdict(lambda: {"count": 0, "ms": 0.0, "flops": 0.0, "bytes": 0.0})
    for event in prof.events():
        if not event.name.startswith("aten::"):
            continue
        # every op's own time (metadata ops' too: their overhead is part of the step); FLOPs
        # and bytes only where the work happens
        op = ops[event.name]
        op["ms"] += event.self_cpu_time_total / 1e3
        op["count"] += 1
        op["flops"] += event.flops or 0
        if _does_work(event):
            op["bytes"] += _input_bytes(event) + max(event.self_cpu_memory_usage, 0)
    return ops, wall_ms, steps


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--workload", choices=["paper", "tiny"], default="paper",
                        help="paper: nip's grid (the figures to report); tiny: checks that it runs")
    parser.add_argument("--top", type=int, default=15, help="ops to list, by measured time")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    logging.getLogger("torchrl").setLevel(logging.WARNING)
    bandwidth = triad_bandwidth()
    peak = {"fp32": gemm_peak(torch.float32), "bf16": gemm_peak(torch.bfloat16)}
    print(f"CPU: {cpu_model()}")
    print(f"triad bandwidth: {bandwidth / 1e9:.1f} GB/s; GEMM peak: fp32 {peak['fp32'] / 1e9:.1f} GFLOP/s, "
          f"bf16 {peak['bf16'] / 1e9:.1f} GFLOP/s (one thread)")
    ops, wall_ms, steps = profile_update(args.precision, args.workload)
    # without native bf16 the trainer runs bf16's products in float32 (precision.Float32Bf16Products)
    emulated = args.precision == "bf16" and not cpu_has_native_bf16()
    rate = peak["fp32" if emulated else args.precision]
    if emulated:
        print("bf16 products run in float32 on bf16 values here (no native bf16): bounded by the fp32 GEMM peak")
    for op in ops.values():
        op["bound_ms"] = max(op["flops"] / rate, op["bytes"] / bandwidth) * 1e3
    total = {k: sum(op[k] for op in ops.values()) for k in ("ms", "flops", "bytes", "bound_ms")}
    per_step = {k: v / steps for k, v in total.items()}
    step_ms = wall_ms / steps
    print(f"precision {args.precision}: {steps} minibatch steps per epoch; per step: "
          f"{per_step['flops'] / 1e9:.3f} GFLOP, {per_step['bytes'] / 1e6:.1f} MB moved, "
          f"measured {step_ms:.1f} ms (profiled ops {per_step['ms']:.1f} ms), "
          f"bound {per_step['bound_ms']:.1f} ms ({step_ms / per_step['bound_ms']:.1f}x above it)")
    print("| op | calls/step | ms/step | share | GFLOP/step | MB/step | bound ms/step | x bound |")
    print("|---|---|---|---|---|---|---|---|")
    for name, op in sorted(ops.items(), key=lambda kv: -kv[1]["ms"])[:args.top]:
        print(f"| {name} | {op['count'] / steps:.0f} | {op['ms'] / steps:.2f} | {op['ms'] / total['ms']:.0%} | "
              f"{op['flops'] / steps / 1e9:.4f} | {op['bytes'] / steps / 1e6:.2f} | "
              f"{op['bound_ms'] / steps:.3f} | "
              + (f"{op['ms'] / op['bound_ms']:.0f} |" if op["bound_ms"] > 0 else "overhead only |"))
    print(f"triad_gb_s={bandwidth / 1e9:.2f} gemm_fp32_gflop_s={peak['fp32'] / 1e9:.1f} "
          f"gemm_bf16_gflop_s={peak['bf16'] / 1e9:.1f} step_ms={step_ms:.2f} bound_ms={per_step['bound_ms']:.3f}")


if __name__ == "__main__":
    main()

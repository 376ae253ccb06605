"""Per-iteration figures of text runs compared across sweep variants (``nipflow sweep --out``).

For each variant (a protocol, say) and iteration, over its runs (seeds): the mean and
sample standard deviation of the verifier's valid-decision rate, accuracy on the training
rollouts and on the held-out test loop, the mean episode length, and the wall times of
sampling and of each group's fine-tune job — each run's figures as its result card reads
them from the run store (:class:`~nip_core.logging.result_card.TextIteration`). Then the
held-out accuracy by datapoint kind (code validation: by mutation), pooled over the runs,
of the first and the last tested iteration; and a plot of the accuracies per iteration.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from nip_core.logging.result_card import TextIteration, format_duration, result_card
from nip_core.runs import RunStore

FIGURES = ("valid_decision_rate", "accuracy", "test_accuracy", "episode_length", "sampling_s")


def _mean_std(values: list[float], fmt: str) -> str:
    if not values:
        return "—"
    mean = statistics.fmean(values)
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    if fmt == "s":
        return f"{format_duration(mean)} ± {std:.0f} s"
    return f"{mean:{fmt}} ± {std:{fmt}}"


def _completed(store: RunStore, labelled_runs: list[tuple[str, str]]) -> dict[str, list[Any]]:
    """label -> the opened runs that completed (in order)."""
    out: dict[str, list[Any]] = {}
    for label, run_id in labelled_runs:
        out.setdefault(label, [])
        if store.exists(run_id):
            run = store.open_run(run_id)
            if result_card(run).status == "completed":
                out[label].append(run)
    return out


def iteration_table(store: RunStore, labelled_runs: list[tuple[str, str]]) -> str:
    """Markdown: one row per variant and iteration, each figure as mean ± std over the runs."""
    header = ["variant", "iteration", "runs", "valid decisions", "train accuracy", "held-out accuracy",
              "episode length", "sampling", "fine-tune jobs"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for label, runs in _completed(store, labelled_runs).items():
        per_run = [result_card(run).per_iteration for run in runs]
        iterations = sorted({it.iteration for its in per_run for it in its})
        for i in iterations:
            at = [it for its in per_run for it in its if it.iteration == i]
            cells = [label, str(i), str(len(at))]
            for name, fmt in zip(FIGURES, (".2f", ".3f", ".3f", ".2f", "s")):
                cells.append(_mean_std([getattr(it, name) for it in at if getattr(it, name) is not None], fmt))
            cells.append(_fine_tune_cell(at))
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _fine_tune_cell(at: list[TextIteration]) -> str:
    groups = sorted({g for it in at for g in it.fine_tune_s})
    if not groups:
        return "—"
    parts = []
    for g in groups:
        times = [it.fine_tune_s[g] for it in at if g in it.fine_tune_s]
        parts.append(f"{g} {_mean_std(times, 's')} ({len(times)} of {len(at)})")
    return "; ".join(parts)


def kind_table(store: RunStore, labelled_runs: list[tuple[str, str]]) -> str | None:
    """Markdown: held-out accuracy by datapoint kind, first and last tested iteration, pooled over runs.

    None where no run logged accuracies by kind.
    """
    pooled: dict[str, dict[str, dict[str, list[float]]]] = {}  # label -> "first"/"last" -> kind -> [right, n]
    for label, runs in _completed(store, labelled_runs).items():
        for run in runs:
            tests = [r for r in run.read_metrics() if r.get("kind") == "test"
                     and any(k.startswith("test_count_by_kind.") for k in r)]
            for when, row in (("first", tests[0]), ("last", tests[-1])) if tests else ():
                for key, n in row.items():
                    if key.startswith("test_count_by_kind."):
                        kind = key[len("test_count_by_kind."):]
                        acc = row[f"test_accuracy_by_kind.{kind}"]
                        cell = pooled.setdefault(label, {}).setdefault(when, {}).setdefault(kind, [0.0, 0.0])
                        cell[0] += acc * n
                        cell[1] += n
    if not pooled:
        return None
    kinds = sorted({k for by_when in pooled.values() for by_kind in by_when.values() for k in by_kind},
                   key=lambda k: (k != "correct", k))
    labels = list(pooled)
    header = ["kind", *[f"{label}: first → last tested" for label in labels]]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for kind in kinds:
        cells = [kind]
        for label in labels:
            ends = []
            for when in ("first", "last"):
                right, n = pooled[label].get(when, {}).get(kind, (0.0, 0.0))
                ends.append(f"{right / n:.2f}" if n else "—")
            n_last = pooled[label].get("last", {}).get(kind, (0.0, 0.0))[1]
            cells.append(f"{ends[0]} → {ends[1]} (n={int(n_last)})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_iterations(store: RunStore, labelled_runs: list[tuple[str, str]], path: Path, title: str) -> None:
    """Held-out and training accuracy per iteration, mean ± std over each variant's runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, 3, figsize=(11.0, 3.6), dpi=100)
    panels = (("test_accuracy", "held-out accuracy"), ("accuracy", "train accuracy"),
              ("episode_length", "mean episode length"))
    for ax, (name, ylabel) in zip(axes, panels):
        for label, runs in _completed(store, labelled_runs).items():
            per_run = [result_card(run).per_iteration for run in runs]
            xs, means, stds = [], [], []
            for i in sorted({it.iteration for its in per_run for it in its}):
                values = [getattr(it, name) for its in per_run for it in its
                          if it.iteration == i and getattr(it, name) is not None]
                if values:
                    xs.append(i)
                    means.append(statistics.fmean(values))
                    stds.append(statistics.stdev(values) if len(values) > 1 else 0.0)
            ax.errorbar(xs, means, yerr=stds, marker="o", capsize=3, label=label)
        if name != "episode_length":
            ax.set_ylim(0, 1)
            ax.axhline(0.5, color="#b03030", linestyle="--", linewidth=1)
        ax.set_xlabel("iteration")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def iteration_sections(store: RunStore, labelled_runs: list[tuple[str, str]], plot: Path, title: str) -> list[str]:
    """The markdown sections of text runs: per iteration, by kind, and the plot (written to ``plot``)."""
    plot_iterations(store, labelled_runs, plot, title)
    lines = ["## Per iteration", "",
             "Mean ± sample std over each variant's completed runs. *Valid decisions*: the share of "
             "training episodes that ended in an accept or reject; *held-out accuracy*: the test loop "
             "on the models of that iteration (iteration 0: the base model); *sampling*: the wall "
             "time of sampling the iteration's training rollouts; *fine-tune jobs*: each group's job, "
             "from its creation to its end by the API's clock (a group with too few examples gets none).",
             "", iteration_table(store, labelled_runs), "", f"![accuracy per iteration]({plot.name})", ""]
    kinds = kind_table(store, labelled_runs)
    if kinds:
        lines += ["## Held-out accuracy by kind", "",
                  "Pooled over the runs: the first and the last tested iteration; *correct*: correct "
                  "solutions, the others: the mutation that made the solution buggy.", "", kinds, ""]
    return lines

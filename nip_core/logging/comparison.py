"""A comparison of sweep variants: final verifier accuracy, mean ± std over seeds, and a plot.

Used by ``nipflow sweep`` (and usable on any set of finished runs): the runs are grouped
by a label (the sweep's variant names, e.g. one per protocol), each run contributes its
result card's final verifier accuracy — of the held-out test loop, or of the last
iteration's training rollouts where a run has no test loop (text runs with
``text_rl.test_scheme=none``); the report says which — and the
table gives per group the mean, the sample standard deviation, the number of runs and
every run's value, so a reader can see the spread behind the mean.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nip_core.logging.result_card import result_card
from nip_core.runs import RunStore


@dataclass
class GroupResult:
    """The runs of one compared variant."""

    label: str
    run_ids: list[str] = field(default_factory=list)
    accuracies: list[float] = field(default_factory=list)
    #: per counted run: "test" (held-out test loop) or "train" (last iteration's rollouts)
    sources: list[str] = field(default_factory=list)
    train_accuracies: list[float] = field(default_factory=list)
    wall_times_s: list[float] = field(default_factory=list)
    trained_tokens: list[int] = field(default_factory=list)
    fine_tune_jobs: list[int] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    @property
    def mean(self) -> float | None:
        return statistics.fmean(self.accuracies) if self.accuracies else None

    @property
    def std(self) -> float | None:
        """Sample standard deviation (0 for a single run)."""
        if not self.accuracies:
            return None
        return statistics.stdev(self.accuracies) if len(self.accuracies) > 1 else 0.0


def collect(store: RunStore, labelled_runs: list[tuple[str, str]]) -> list[GroupResult]:
    """Group ``(label, run_id)`` pairs, keeping the labels' first-seen order.

    A run that did not complete, or has no accuracy at all, is listed under ``failed``
    and left out of the statistics.
    """
    groups: dict[str, GroupResult] = {}
    for label, run_id in labelled_runs:
        group = groups.setdefault(label, GroupResult(label))
        group.run_ids.append(run_id)
        if not store.exists(run_id):
            group.failed.append(f"{run_id} (not in the run store)")
            continue
        card = result_card(store.open_run(run_id))
        accuracy = card.final_test_accuracy if card.final_test_accuracy is not None else card.final_train_accuracy
        if card.status != "completed" or accuracy is None:
            group.failed.append(f"{run_id} ({card.status})")
            continue
        group.accuracies.append(float(accuracy))
        group.sources.append("test" if card.final_test_accuracy is not None else "train")
        if card.final_train_accuracy is not None:
            group.train_accuracies.append(float(card.final_train_accuracy))
        if card.total_wall_time_s is not None:
            group.wall_times_s.append(card.total_wall_time_s)
        if card.trained_tokens is not None:
            group.trained_tokens.append(card.trained_tokens)
        if card.fine_tune_jobs is not None:
            group.fine_tune_jobs.append(card.fine_tune_jobs)
    return list(groups.values())


def _pm(group: GroupResult) -> str:
    return "—" if group.mean is None else f"{group.mean:.3f} ± {group.std:.3f}"


def comparison_table(groups: list[GroupResult], *, text_runs: bool = False) -> str:
    """The markdown table: one row per group, in the given order."""
    header = ["variant", "final verifier accuracy (mean ± std)", "n", "per run", "train accuracy (mean)",
              "wall time per run (mean)"]
    if text_runs:
        header += ["fine-tune jobs per run", "trained tokens per run"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for g in groups:
        per_run = ", ".join(f"{a:.3f}" for a in g.accuracies) or "—"
        if g.failed:
            per_run += f" (not counted: {', '.join(g.failed)})"
        train = f"{statistics.fmean(g.train_accuracies):.3f}" if g.train_accuracies else "—"
        wall = f"{statistics.fmean(g.wall_times_s):.0f} s" if g.wall_times_s else "—"
        cells = [g.label, _pm(g), str(len(g.accuracies)), per_run, train, wall]
        if text_runs:
            cells += [", ".join(map(str, g.fine_tune_jobs)) or "—", ", ".join(map(str, g.trained_tokens)) or "—"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def accuracy_source(groups: list[GroupResult]) -> str:
    """One sentence saying where the compared accuracies come from."""
    sources = {source for g in groups for source in g.sources}
    if sources == {"test"}:
        return "Accuracy: the verifier's on the held-out test loop after the last iteration."
    if sources == {"train"}:
        return ("Accuracy: the verifier's on the last iteration's training rollouts (these runs have no "
                "test loop: `text_rl.test_scheme` is `none`).")
    return ("Accuracy: the held-out test loop's where a run has one, else the last iteration's training "
            "rollouts (the runs differ).")


def plot_comparison(groups: list[GroupResult], path: Path, title: str, *, chance: float | None = 0.5) -> None:
    """Bar chart of the mean final verifier accuracy per group, std error bars, every run as a dot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.2, 4.0), dpi=100)
    xs = range(len(groups))
    ax.bar(xs, [g.mean or 0.0 for g in groups], yerr=[g.std or 0.0 for g in groups], capsize=4,
           color="#8fb3d9", edgecolor="#2d5f8b")
    for x, g in zip(xs, groups):
        ax.scatter([x] * len(g.accuracies), g.accuracies, color="#1b1b1b", s=12, zorder=3)
    if chance is not None:
        ax.axhline(chance, color="#b03030", linestyle="--", linewidth=1, label="chance")
        ax.legend(fontsize=8, loc="lower right")
    ax.set_xticks(list(xs), [g.label for g in groups], fontsize=8, rotation=20)
    ax.set_ylabel("final verifier accuracy")
    ax.set_ylim(0, 1)
    ax.set_title(title, fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_comparison(store: RunStore, labelled_runs: list[tuple[str, str]], out: str | Path, *,
                     title: str, preamble: str = "") -> Path:
    """Write the markdown file ``out`` (the table under ``preamble``) and the plot beside it.

    The plot is ``out`` with the suffix ``.png``; the markdown links it by file name.
    Returns ``out``.
    """
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    groups = collect(store, labelled_runs)
    text_runs = any(g.fine_tune_jobs for g in groups)
    plot = path.with_suffix(".png")
    plot_comparison(groups, plot, title)
    text = "\n".join([f"# {title}", "", preamble.strip(), "", accuracy_source(groups), "",
                      comparison_table(groups, text_runs=text_runs), "",
                      f"![final verifier accuracy per variant]({plot.name})", ""])
    path.write_text(text)
    return path


def summary_rows(groups: list[GroupResult]) -> list[dict[str, Any]]:
    """One JSON-serialisable row per group (for ``--json``)."""
    return [{"variant": g.label, "mean": g.mean, "std": g.std, "n": len(g.accuracies),
             "accuracies": g.accuracies, "sources": g.sources, "run_ids": g.run_ids, "failed": g.failed}
            for g in groups]

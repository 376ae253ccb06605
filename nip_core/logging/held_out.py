"""Sweep variants compared on further held-out files: accuracy, accuracy by WL score, a plot.

``nipflow sweep --evaluate FILE`` tests every point's final checkpoint on ``FILE`` (every
pair once, :func:`nip_core.evaluation.evaluate_run` in ``"pairs"`` mode) after the sweep.
This module turns those results into the comparison's extra sections: per variant the
accuracy on the file (mean ± std over the runs, every run's value), the difference from the
baseline variant (as :func:`~nip_core.logging.comparison.differences` computes it, with the
binomial standard error over the file's pairs for one run each), and the accuracy by the
pairs' Weisfeiler–Lehman score (``-1``: isomorphic pairs; a higher score, a pair that more
rounds of colour refinement fail to tell apart), which shows where each protocol wins or
loses; the plot beside the markdown has one group of bars per WL score.

The results are given as ``(label, seed, result)`` triples, ``result`` being what
``evaluate_run`` returns; nothing here trains or loads a model.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any, Mapping, Sequence

from nip_core.logging.comparison import GroupResult, difference_lines

#: how the WL scores are named in tables and plots
ISOMORPHIC_SCORE = "-1"


def held_out_groups(results: Sequence[tuple[str, int, Mapping[str, Any]]]) -> list[GroupResult]:
    """One :class:`GroupResult` per label (first-seen order): each run's accuracy on the file,
    its seed and the binomial standard error over the pairs evaluated."""
    groups: dict[str, GroupResult] = {}
    for label, seed, result in results:
        group = groups.setdefault(label, GroupResult(label))
        accuracy, n = float(result["test_accuracy"]), int(result["n"])
        group.run_ids.append(str(result["run_id"]))
        group.counted.append(str(result["run_id"]))
        group.accuracies.append(accuracy)
        group.sources.append("test")
        group.seeds.append(int(seed))
        group.standard_errors.append(math.sqrt(accuracy * (1.0 - accuracy) / n) if n > 0 else None)
    return list(groups.values())


def accuracy_by_wl_score(results: Sequence[tuple[str, int, Mapping[str, Any]]]
                         ) -> tuple[list[str], dict[str, int], dict[str, dict[str, float]]]:
    """``(scores, pairs per score, {label: {score: mean accuracy over the label's runs}})``.

    ``scores`` are sorted numerically (isomorphic first). Every run of a file evaluates the
    same pairs, so the counts are the file's; a run without a breakdown (a ``solo_agent``
    run) adds nothing to the means.
    """
    counts: dict[str, int] = {}
    per_label: dict[str, dict[str, list[float]]] = {}
    for label, _, result in results:
        cells = per_label.setdefault(label, {})
        for score, (accuracy, count) in (result.get("accuracy_by_wl_score") or {}).items():
            counts[score] = int(count)
            cells.setdefault(score, []).append(float(accuracy))
    scores = sorted(counts, key=int)
    means = {label: {s: statistics.fmean(v) for s, v in cells.items()} for label, cells in per_label.items()}
    return scores, counts, means


def file_label(dataset_file: str) -> str:
    """A short name of a dataset file: ``wl-large/test`` for the original layout's
    ``.../wl-large/raw/test/data.pt`` (every such file is called ``data.pt``), else the file's name."""
    parts = Path(dataset_file).parts
    if len(parts) >= 4 and parts[-1] == "data.pt" and parts[-3] == "raw":
        return f"{parts[-4]}/{parts[-2]}"
    return Path(dataset_file).name


def score_name(score: str) -> str:
    return "isomorphic" if score == ISOMORPHIC_SCORE else f"WL {score}"


def held_out_section(results: Sequence[tuple[str, int, Mapping[str, Any]]], *, dataset_file: str,
                     baseline: str | None, plot_name: str | None) -> list[str]:
    """Markdown lines of one file's section (a ``##`` heading, two tables, the differences)."""
    groups = held_out_groups(results)
    first = results[0][2]
    lines = [f"## Held-out file `{dataset_file}`", "",
             f"{first['num_pairs']} pairs of up to {first['max_nodes']} nodes, each pair once (`nipflow evaluate "
             "--mode pairs` on each run's final checkpoint).", "",
             "| variant | accuracy (mean ± std) | n | per run |", "|---|---|---|---|"]
    for g in groups:
        lines.append(f"| {g.label} | {g.mean:.3f} ± {g.std:.3f} | {len(g.accuracies)} | "
                     f"{', '.join(f'{a:.3f}' for a in g.accuracies)} |")
    lines.append("")
    lines += difference_lines(groups, baseline)
    scores, counts, means = accuracy_by_wl_score(results)
    if scores:
        header = [f"{score_name(s)} ({counts[s]} pairs)" for s in scores]
        lines += ["Accuracy by WL score of the pair (mean over the runs):", "",
                  "| variant | " + " | ".join(header) + " |", "|---|" + "---|" * len(scores)]
        for g in groups:
            cells = [f"{means[g.label][s]:.3f}" if s in means.get(g.label, {}) else "—" for s in scores]
            lines.append(f"| {g.label} | " + " | ".join(cells) + " |")
        lines.append("")
    if plot_name:
        lines += [f"![accuracy by WL score on {file_label(dataset_file)}]({plot_name})", ""]
    return lines


def plot_by_wl_score(results: Sequence[tuple[str, int, Mapping[str, Any]]], path: Path, title: str) -> bool:
    """Grouped bars: per WL score, each variant's mean accuracy (runs as dots). False: no breakdown."""
    scores, counts, means = accuracy_by_wl_score(results)
    if not scores:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(dict.fromkeys(label for label, _, _ in results))
    width = 0.8 / len(labels)
    fig, ax = plt.subplots(figsize=(max(7.2, 1.4 * len(scores) + 2), 4.0), dpi=100)
    for k, label in enumerate(labels):
        xs = [i - 0.4 + width * (k + 0.5) for i in range(len(scores))]
        ax.bar(xs, [means.get(label, {}).get(s, 0.0) for s in scores], width, label=label)
        for x, s in zip(xs, scores):
            runs = [r["accuracy_by_wl_score"][s][0] for lab, _, r in results
                    if lab == label and s in (r.get("accuracy_by_wl_score") or {})]
            ax.scatter([x] * len(runs), runs, color="#1b1b1b", s=6, zorder=3)
    ax.set_xticks(range(len(scores)), [f"{score_name(s)}\n({counts[s]} pairs)" for s in scores], fontsize=8)
    ax.set_ylabel("verifier accuracy")
    ax.set_ylim(0, 1.05)
    ax.set_title(title, fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, ncol=min(len(labels), 4), loc="upper center", bbox_to_anchor=(0.5, -0.18))
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def held_out_card_row(results: Sequence[tuple[str, int, Mapping[str, Any]]], dataset_file: str,
                      index: int) -> tuple[str, str]:
    """The comparison card's row of the ``index``-th file (from 1): each variant's mean accuracy on it."""
    accuracies = ", ".join(f"{g.label} {g.mean:.3f}" for g in held_out_groups(results))
    return f"held-out file {index}", f"{dataset_file}: {accuracies}"

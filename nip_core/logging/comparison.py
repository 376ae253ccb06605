"""A comparison of sweep variants: final verifier accuracy, mean ± std over seeds, and a plot.

Used by ``nipflow sweep`` (and usable on any set of finished runs): the runs are grouped
by a label (the sweep's variant names, e.g. one per protocol), each run contributes its
result card's final verifier accuracy — of the held-out test loop, or of the last
iteration's training rollouts where a run has no test loop (text runs with
``text_rl.test_scheme=none``); the report says which — and the
table gives per group the mean, the sample standard deviation, the number of runs and
every run's value, so a reader can see the spread behind the mean.

A sweep that names a ``baseline`` variant (the main job: nip beside ``solo_verifier``) also
gets, per other variant, the difference of its accuracy from the baseline's with a spread
(:func:`differences`): over the seeds both ran (paired by seed) when there are two or more,
the standard error of the two held-out estimates (binomial, over the test loop's episodes)
when each ran once.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nip_core.logging.result_card import result_card, terminal_card
from nip_core.logging.text_iterations import iteration_sections
from nip_core.runs import RunStore


@dataclass
class GroupResult:
    """The runs of one compared variant."""

    label: str
    run_ids: list[str] = field(default_factory=list)
    #: the runs counted in the statistics (completed, with an accuracy), in order
    counted: list[str] = field(default_factory=list)
    accuracies: list[float] = field(default_factory=list)
    #: per counted run: "test" (held-out test loop) or "train" (last iteration's rollouts)
    sources: list[str] = field(default_factory=list)
    train_accuracies: list[float] = field(default_factory=list)
    #: per counted run: its seed, and the binomial standard error of its accuracy (None: unknown)
    seeds: list[int] = field(default_factory=list)
    standard_errors: list[float | None] = field(default_factory=list)
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
        run = store.open_run(run_id)
        card = result_card(run)
        accuracy = card.final_test_accuracy if card.final_test_accuracy is not None else card.final_train_accuracy
        if card.status != "completed" or accuracy is None:
            group.failed.append(f"{run_id} ({card.status})")
            continue
        group.counted.append(run_id)
        group.accuracies.append(float(accuracy))
        group.sources.append("test" if card.final_test_accuracy is not None else "train")
        group.seeds.append(int(run.params.seed))
        group.standard_errors.append(_standard_error(run, float(accuracy), group.sources[-1]))
        if card.final_train_accuracy is not None:
            group.train_accuracies.append(float(card.final_train_accuracy))
        if card.total_wall_time_s is not None:
            group.wall_times_s.append(card.total_wall_time_s)
        if card.trained_tokens is not None:
            group.trained_tokens.append(card.trained_tokens)
        if card.fine_tune_jobs is not None:
            group.fine_tune_jobs.append(card.fine_tune_jobs)
    return list(groups.values())


def _standard_error(run, accuracy: float, source: str) -> float | None:
    """sqrt(p(1-p)/n) over the episodes of the run's last test loop (None for train accuracies)."""
    if source != "test":
        return None
    tests = [r for r in run.read_metrics() if r.get("kind") == "test"]
    episodes = tests[-1].get("test_num_episodes") if tests else None
    if not isinstance(episodes, (int, float)) or episodes < 1:
        return None
    return math.sqrt(accuracy * (1.0 - accuracy) / episodes)


@dataclass
class Difference:
    """``label``'s accuracy minus ``baseline``'s, with its spread and where the spread comes from."""

    label: str
    baseline: str
    value: float
    spread: float | None
    #: "held-out" (one run each: standard error of the two held-out estimates), "seeds" (paired
    #: by seed: std of the per-seed differences), "groups" (unpaired: standard error of the
    #: difference of the means)
    spread_kind: str
    #: the seeds of the paired runs and their differences (empty seeds: the runs are not paired)
    seeds: list[int] = field(default_factory=list)
    per_seed: list[float] = field(default_factory=list)

    def to_text(self) -> str:
        spread = "" if self.spread is None else f" ± {self.spread:.3f}"
        how = {"seeds": f"std over {len(self.per_seed)} seeds, paired: "
                        + ", ".join(f"{d:+.3f}" for d in self.per_seed),
               "held-out": "one run each: standard error of the two held-out estimates",
               "groups": "unpaired: standard error of the difference of the means"}[self.spread_kind]
        return f"{self.value:+.3f}{spread} ({how})"


def differences(groups: list[GroupResult], baseline: str) -> list[Difference]:
    """Every other group's mean accuracy minus ``baseline``'s, with a spread.

    With one run each: the difference of the two runs, ± sqrt(se_a² + se_b²) of their
    held-out estimates. Groups that ran the same two or more seeds, each once, are paired by
    seed: ± the sample std of the per-seed differences. Otherwise unpaired: ± the standard
    error of the difference of the means (a one-run group's part is its held-out standard
    error). A group without any counted run gets no difference.
    """
    base = next((g for g in groups if g.label == baseline), None)
    if base is None:
        raise ValueError(f"baseline {baseline!r} is not one of the variants {[g.label for g in groups]}")
    result = []
    for g in groups:
        if g is base or not g.accuracies or not base.accuracies:
            continue
        if len(g.accuracies) == len(base.accuracies) == 1:
            errors = (g.standard_errors[0], base.standard_errors[0])
            spread = None if None in errors else math.hypot(*errors)
            paired = g.seeds if g.seeds == base.seeds else []  # the seed both ran, if they ran one
            result.append(Difference(g.label, baseline, g.accuracies[0] - base.accuracies[0], spread, "held-out",
                                     list(paired), [g.accuracies[0] - base.accuracies[0]]))
        elif _same_unique_seeds(g, base):
            by_seed = dict(zip(base.seeds, base.accuracies))
            diffs = [a - by_seed[s] for s, a in zip(g.seeds, g.accuracies)]
            result.append(Difference(g.label, baseline, statistics.fmean(diffs), statistics.stdev(diffs), "seeds",
                                     list(g.seeds), diffs))
        else:
            parts = [_standard_error_of_mean(g), _standard_error_of_mean(base)]
            spread = None if None in parts else math.hypot(*parts)
            result.append(Difference(g.label, baseline, g.mean - base.mean, spread, "groups"))
    return result


def _same_unique_seeds(a: GroupResult, b: GroupResult) -> bool:
    return len(set(a.seeds)) == len(a.seeds) == len(b.seeds) and set(a.seeds) == set(b.seeds)


def _standard_error_of_mean(g: GroupResult) -> float | None:
    return g.standard_errors[0] if len(g.accuracies) == 1 else g.std / math.sqrt(len(g.accuracies))


def comparison_card(groups: list[GroupResult], *, title: str, wall_time_s: float, out: str,
                    baseline: str | None = None, extra: list[tuple[str, str]] = ()) -> str:
    """The terminal card of a sweep: each variant's accuracy, the differences from ``baseline``, wall time."""
    rows: list[tuple[str, str]] = []
    for g in groups:
        if g.mean is None:
            rows.append((g.label, "no completed run: " + ", ".join(g.failed)))
            continue
        if len(g.accuracies) == 1:
            se = g.standard_errors[0]
            acc = f"{g.accuracies[0]:.3f}" + ("" if se is None else f" ± {se:.3f} (s.e.)")
        else:
            acc = f"{g.mean:.3f} ± {g.std:.3f} (std over {len(g.accuracies)} runs)"
        source = "held-out" if set(g.sources) == {"test"} else "final"
        train = f", train {statistics.fmean(g.train_accuracies):.3f}" if g.train_accuracies else ""
        wall = f", {statistics.fmean(g.wall_times_s) / 60:.1f} min per run" if g.wall_times_s else ""
        failed = f" (not counted: {', '.join(g.failed)})" if g.failed else ""
        rows.append((g.label, f"{source} {acc}{train}{wall}{failed}"))
    for d in differences(groups, baseline) if baseline else []:
        rows.append((f"{d.label} − {d.baseline}", d.to_text()))
    rows += [("wall time", f"{wall_time_s / 60:.1f} min in all"), *extra, ("comparison", out)]
    return terminal_card(f"Comparison: {title}", rows)


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
                     title: str, preamble: str = "", baseline: str | None = None) -> Path:
    """Write the markdown file ``out`` (the table under ``preamble``) and the plot beside it.

    The plot is ``out`` with the suffix ``.png``; the markdown links it by file name. Text
    runs add their per-iteration sections and plot (``<stem>_iterations.png``,
    :mod:`nip_core.logging.text_iterations`). Returns ``out``.
    """
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    groups = collect(store, labelled_runs)
    text_runs = any(g.fine_tune_jobs for g in groups)
    plot = path.with_suffix(".png")
    plot_comparison(groups, plot, title)
    sections = (iteration_sections(store, labelled_runs, path.with_name(f"{path.stem}_iterations.png"), title)
                if text_runs else [])
    text = "\n".join([f"# {title}", "", preamble.strip(), "", accuracy_source(groups), "",
                      comparison_table(groups, text_runs=text_runs), "",
                      *difference_lines(groups, baseline),
                      f"![final verifier accuracy per variant]({plot.name})", "", *sections])
    path.write_text(text)
    return path


def difference_lines(groups: list[GroupResult], baseline: str | None) -> list[str]:
    """Markdown bullets of the differences from ``baseline`` (none without one)."""
    if not baseline:
        return []
    found = differences(groups, baseline)
    return [f"Difference from `{baseline}`:", "",
            *[f"* {d.label}: {d.to_text()}" for d in found], ""] if found else []


def summary_rows(groups: list[GroupResult]) -> list[dict[str, Any]]:
    """One JSON-serialisable row per group (for ``--json``)."""
    return [{"variant": g.label, "mean": g.mean, "std": g.std, "n": len(g.accuracies),
             "accuracies": g.accuracies, "sources": g.sources, "seeds": g.seeds,
             "standard_errors": g.standard_errors, "run_ids": g.run_ids, "failed": g.failed}
            for g in groups]

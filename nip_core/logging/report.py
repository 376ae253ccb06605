"""``nipflow report``: PNG learning curves and a markdown summary from ``metrics.jsonl``.

Works on any run (graph isomorphism or code validation) because it only reads the run
store: per-agent reward curves (``<agent>.mean_episode_reward``), verifier accuracy on
train and test (nip's ``mean_accuracy`` / ``test_mean_accuracy`` and, where logged, the
accuracy with time-outs wrong, ``mean_decided_accuracy``: the final numbers are that one, as
on the result card; docs/behaviour.md#b15), decision rate and episode length. Several run
ids make a sweep report: a table and a bar chart of the final verifier accuracy per run
(labelled by protocol).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from nip_core.runs import RunStore

OTHER_CURVES = {
    "decision_rate": ("mean_decision_rate", "decision_rate", "verifier.mean_decision_rate"),
    "episode_length": ("mean_episode_length",),
}


def _series(rows: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for row in rows:
        value = row.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            xs.append(int(row["iteration"]))
            ys.append(float(value))
    return xs, ys


def final_value(rows: list[dict[str, Any]], key: str) -> float | None:
    _, ys = _series(rows, key)
    return ys[-1] if ys else None


def _first_final(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> float | None:
    """The final value of the first of ``keys`` that ``rows`` have."""
    for key in keys:
        value = final_value(rows, key)
        if value is not None:
            return value
    return None


def summarise_run(store: RunStore, run_id: str) -> dict[str, Any]:
    return summarise(store.open_run(run_id))


def summarise(run) -> dict[str, Any]:
    """Final numbers and curves of an opened run, from its ``metrics.jsonl``."""
    run_id = run.run_id
    rows = run.read_metrics()
    train = [r for r in rows if r.get("kind", "train") == "train"]
    test = [r for r in rows if r.get("kind") == "test"]
    agents = sorted({k.split(".", 1)[0] for r in train for k in r if k.endswith(".mean_episode_reward")})
    summary = {
        "run_id": run_id,
        "protocol": run.params.interaction_protocol,
        "trainer": run.params.trainer,
        "scenario": run.params.scenario,
        "iterations_logged": len(train),
        "final_train_accuracy": _first_final(train, ("mean_decided_accuracy", "mean_accuracy")),
        "final_test_accuracy": _first_final(test, ("test_mean_decided_accuracy", "test_mean_accuracy",
                                                   "mean_accuracy")),
        "final_reward": {a: final_value(train, f"{a}.mean_episode_reward") for a in agents},
        "final_episode_length": final_value(train, "mean_episode_length"),
    }
    return {"summary": summary, "train": train, "test": test, "agents": agents}


def _plot(path: Path, title: str, curves: list[tuple[str, list[int], list[float]]], ylabel: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    for label, xs, ys in curves:
        ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3, label=label)
    ax.set_title(title)
    ax.set_xlabel("iteration")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if curves:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _fmt(v: Any) -> str:
    return "—" if v is None else (f"{v:.4f}" if isinstance(v, float) else str(v))


def write_run_report(store: RunStore, run_id: str, out_dir: Path) -> Path:
    data = summarise_run(store, run_id)
    out_dir.mkdir(parents=True, exist_ok=True)
    train, test = data["train"], data["test"]
    _plot(out_dir / "rewards.png", f"{run_id}: mean episode reward per agent",
          [(a, *_series(train, f"{a}.mean_episode_reward")) for a in data["agents"]], "reward")
    acc_curves = [("train", *_series(train, "mean_accuracy"))]
    if test:
        acc_curves.append(("test", *_series(test, "test_mean_accuracy")))
    for label, rows, key in (("train, time-outs wrong", train, "mean_decided_accuracy"),
                             ("test, time-outs wrong", test, "test_mean_decided_accuracy")):
        if _series(rows, key)[0]:
            acc_curves.append((label, *_series(rows, key)))
    _plot(out_dir / "accuracy.png", f"{run_id}: verifier accuracy", acc_curves, "accuracy")
    for name, keys in OTHER_CURVES.items():
        curves = [(k, *_series(train, k)) for k in keys if _series(train, k)[0]]
        _plot(out_dir / f"{name}.png", f"{run_id}: {name.replace('_', ' ')}", curves, name)
    text = summary_markdown(data["summary"], images=True)
    path = out_dir / "summary.md"
    path.write_text(text)
    return path


def summary_markdown(s: dict[str, Any], images: bool = False) -> str:
    """The markdown summary of one run (also attached by the Prefect flows as an artifact)."""
    lines = [f"# Run `{s['run_id']}`", "",
             f"{s['scenario']} / {s['trainer']} / protocol **{s['protocol']}** — "
             f"{s['iterations_logged']} iterations logged", "",
             "| metric | final value |", "|---|---|",
             f"| verifier train accuracy | {_fmt(s['final_train_accuracy'])} |",
             f"| verifier test accuracy | {_fmt(s['final_test_accuracy'])} |",
             f"| mean episode length | {_fmt(s['final_episode_length'])} |"]
    lines += [f"| {agent} mean episode reward | {_fmt(v)} |" for agent, v in s["final_reward"].items()]
    if images:
        lines += ["", "![rewards](rewards.png)", "![accuracy](accuracy.png)",
                  "![decision rate](decision_rate.png)", "![episode length](episode_length.png)"]
    lines.append("")
    return "\n".join(lines)


def write_sweep_report(store: RunStore, run_ids: list[str], out_dir: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    summaries = [summarise_run(store, r)["summary"] for r in run_ids]
    lines = ["# Sweep", "", "| run | protocol | trainer | train accuracy | test accuracy |", "|---|---|---|---|---|"]
    for s in summaries:
        lines.append(f"| {s['run_id']} | {s['protocol']} | {s['trainer']} | "
                     f"{_fmt(s['final_train_accuracy'])} | {_fmt(s['final_test_accuracy'])} |")
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    labels = [f"{s['protocol']}\n{s['run_id'][-12:]}" for s in summaries]
    values = [s["final_test_accuracy"] if s["final_test_accuracy"] is not None
              else (s["final_train_accuracy"] or 0.0) for s in summaries]
    ax.bar(range(len(values)), values)
    ax.set_xticks(range(len(values)), labels, fontsize=7)
    ax.set_ylabel("final verifier accuracy")
    ax.set_ylim(0, 1)
    fig.tight_layout()
    fig.savefig(out_dir / "final_accuracy.png")
    plt.close(fig)
    lines += ["", "![final accuracy](final_accuracy.png)", ""]
    path = out_dir / "summary.md"
    path.write_text("\n".join(lines))
    return path


def write_report(run_ids: list[str], runs_dir: str, out_dir: str | None = None) -> Path:
    """Write the report of one run (or a sweep of several) and return the markdown path."""
    store = RunStore(runs_dir)
    if len(run_ids) == 1:
        out = Path(out_dir) if out_dir else Path(store.run_storage(run_ids[0]).full("report"))
        return write_run_report(store, run_ids[0], out)
    out = Path(out_dir or "sweep-report")
    return write_sweep_report(store, run_ids, out)

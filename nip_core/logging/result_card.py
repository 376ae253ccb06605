"""The result card: what a run did and where everything about it is, from the run store alone.

``nipflow run``/``resume`` print it at the end (``--json``: as JSON) and the
``train_experiment`` flow attaches it as a markdown artifact. It is built only from
what the run store holds (parameters, ``state.json``, ``metrics.jsonl``,
``metadata.json``, fine-tune records, stage summaries), never from a live trainer, so
it is right whichever processes trained the run (RL blocks on other workers, earlier
invocations that were killed and resumed).

Wall time comes from the run's *invocations*: every driver (``nipflow run --direct``, a
``train_experiment`` flow run) records one in ``metadata.json`` (``invocations``) with
:func:`~nip_core.runs.invocations.begin_invocation` when it starts driving the run and
:func:`~nip_core.runs.invocations.end_invocation` when it
stops, with how it ended. The card reports the latest invocation's wall time and the
sum over all finished ones.
"""

from __future__ import annotations

import glob
import json
import os
import shlex
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from nip_core.errors import CheckpointNotFoundError, CorruptCheckpointError
from nip_core.runs.invocations import INVOCATIONS_KEY

def _seconds_between(start: str | None, end: str | None) -> float | None:
    if not start or not end:
        return None
    try:
        return max((datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds(), 0.0)
    except ValueError:
        return None


@dataclass
class FineTuneJob:
    """One fine-tune job of a text run (the latest attempt of an iteration and group)."""

    iteration: int
    group: str
    job_id: str
    attempts: int
    trained_tokens: int | None


@dataclass
class TextIteration:
    """What one iteration of a text run did (None: not logged or not measured)."""

    iteration: int
    valid_decision_rate: float | None = None
    accuracy: float | None = None
    test_accuracy: float | None = None
    episode_length: float | None = None
    sampling_s: float | None = None
    fine_tune_s: dict[str, float] = field(default_factory=dict)

    def line(self) -> str:
        def num(v: float | None, fmt: str) -> str:
            return "—" if v is None else format(v, fmt)

        parts = [f"valid decisions {num(self.valid_decision_rate, '.0%')}", f"accuracy {num(self.accuracy, '.3f')}"]
        if self.test_accuracy is not None:
            parts.append(f"test {self.test_accuracy:.3f}")
        parts.append(f"episode length {num(self.episode_length, '.2f')}")
        if self.sampling_s is not None:
            parts.append(f"sampling {format_duration(self.sampling_s)}")
        parts += [f"fine-tune {g} {format_duration(t)}" for g, t in sorted(self.fine_tune_s.items())]
        return " · ".join(parts)


@dataclass
class ResultCard:
    """What a run did and where to look; see :func:`result_card`."""

    run_id: str
    status: str
    scenario: str
    trainer: str
    protocol: str
    dataset: str
    params_hash: str
    iterations_done: int
    iterations_planned: int
    started: str | None = None
    ended: str | None = None
    wall_time_s: float | None = None
    total_wall_time_s: float | None = None
    invocations: int = 0
    final_train_accuracy: float | None = None
    final_train_iteration: int | None = None
    final_test_accuracy: float | None = None
    final_test_iteration: int | None = None
    precision: str | None = None
    text_run: bool = False
    fine_tune_jobs: int | None = None
    trained_tokens: int | None = None
    jobs: list[FineTuneJob] = field(default_factory=list)
    per_iteration: list[TextIteration] = field(default_factory=list)
    run_store: str = ""
    report: str = ""
    report_written: bool = False
    report_command: str = ""
    wandb: str | None = None
    prefect_ui: str | None = None
    flow_run_id: str | None = None
    message: str | None = None

    # -- output ---------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict of every field (``jobs`` as a list of dicts)."""
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def _rows(self) -> list[tuple[str, str]]:
        status = self.status + (f": {self.message}" if self.message else "")
        rows = [("status", status),
                ("experiment", f"{self.scenario} / {self.trainer} / protocol {self.protocol} / "
                               f"dataset {self.dataset}"),
                ("iterations", f"{self.iterations_done}/{self.iterations_planned}"),
                *([("precision", self.precision)] if self.precision else []),
                ("wall time", _wall_time(self)),
                ("train accuracy", _accuracy(self.final_train_accuracy, self.final_train_iteration)),
                ("test accuracy", _accuracy(self.final_test_accuracy, self.final_test_iteration))]
        if self.text_run:
            rows += [("fine-tune jobs", str(self.fine_tune_jobs or 0)),
                     ("trained tokens", f"{self.trained_tokens or 0:,}")]
            rows += [(f"iteration {it.iteration}", it.line()) for it in self.per_iteration]
        report = f"{self.report}" if self.report_written else f"{self.report_command}  (writes {self.report})"
        rows += [("run store", self.run_store), ("report", report), ("W&B", self.wandb or "not used"),
                 ("Prefect UI", self.prefect_ui or "none (run with --direct)")]
        return rows

    def to_text(self) -> str:
        """A compact card for the terminal: a title rule, aligned lines, a closing rule."""
        return terminal_card(f"Result card: {self.run_id}", self._rows())

    def to_markdown(self) -> str:
        """The card as markdown; the first line is ``# Result card: <run_id>``."""
        lines = [f"# Result card: {self.run_id}", "", "| | |", "|---|---|"]
        for key, value in self._rows():
            plain = key.startswith("iteration ") or key in (
                "status", "experiment", "iterations", "precision", "wall time", "train accuracy", "test accuracy",
                "fine-tune jobs", "trained tokens")
            shown = value if plain else f"`{value}`"
            if key == "Prefect UI" and value.startswith("http"):
                shown = f"[{value}]({value})"
            lines.append(f"| {key} | {_md_cell(shown)} |")
        lines += ["", f"params hash `{self.params_hash}`; {self.invocations} invocation(s)."]
        if self.jobs:
            lines += ["", "## Fine-tune jobs", "", "| iteration | group | job | attempts | trained tokens |",
                      "|---|---|---|---|---|"]
            lines += [f"| {j.iteration} | {j.group} | `{j.job_id}` | {j.attempts} | "
                      f"{'' if j.trained_tokens is None else j.trained_tokens} |" for j in self.jobs]
        lines.append("")
        return "\n".join(lines)


def terminal_card(title: str, rows: list[tuple[str, str]]) -> str:
    """``rows`` as aligned ``key  value`` lines between a rule titled ``title`` and a closing rule."""
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    rule_len = min(max(len(line) for line in lines), 100)
    head = f"── {title} "
    return "\n".join([head + "─" * max(rule_len - len(head), 3), *lines, "─" * rule_len])


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _accuracy(value: float | None, iteration: int | None) -> str:
    if value is None:
        return "—"
    return f"{value:.4f}" + (f" (iteration {iteration})" if iteration is not None else "")


def format_duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, s = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {s:02d} s"


def _wall_time(card: ResultCard) -> str:
    if card.wall_time_s is None and card.total_wall_time_s is None:
        return "unknown (no finished invocation recorded)"
    this = format_duration(card.wall_time_s) if card.wall_time_s is not None else "unfinished"
    total = format_duration(card.total_wall_time_s) if card.total_wall_time_s is not None else "unknown"
    return f"{this} this invocation, {total} in total ({card.invocations} invocation(s))"


# -- reading the run store --------------------------------------------------------------------


def _last_value(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> tuple[float | None, int | None]:
    """The last finite value of the first of ``keys`` a row has, and that row's iteration."""
    for row in reversed(rows):
        for key in keys:
            value = row.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value:
                return float(value), (int(row["iteration"]) if "iteration" in row else None)
    return None, None


def _state(run: Any) -> dict[str, Any]:
    try:
        return run.read_json("state.json", "state file")
    except (CheckpointNotFoundError, CorruptCheckpointError):
        return {}


def _fine_tune_jobs(run: Any) -> list[FineTuneJob]:
    """The jobs recorded in ``fine_tune/iter_<i>_<group>.json`` with their trained tokens."""
    tokens: dict[tuple[int, str], int] = {}
    for name in run.storage.listdir("stages"):
        if name.endswith("_await_fine_tune_jobs.json"):
            summary = run.read_json(f"stages/{name}", "stage summary")
            for group, n in (summary.get("trained_tokens") or {}).items():
                tokens[(int(summary.get("iteration", -1)), group)] = int(n or 0)
    jobs = []
    for name in run.list_files("fine_tune"):
        if not (name.startswith("iter_") and name.endswith(".json")):
            continue
        it_text, _, group = name[len("iter_"):-len(".json")].partition("_")
        record = run.read_json(f"fine_tune/{name}", "fine-tune record")
        if not it_text.isdigit() or not record.get("job_id"):
            continue
        ids = {record["job_id"], *(a.get("job_id") for a in record.get("attempts") or [] if a.get("job_id"))}
        jobs.append(FineTuneJob(iteration=int(it_text), group=group, job_id=str(record["job_id"]),
                                attempts=len(ids), trained_tokens=tokens.get((int(it_text), group))))
    return sorted(jobs, key=lambda j: (j.iteration, j.group))


def _text_iterations(run: Any, train: list[dict[str, Any]], test: list[dict[str, Any]]) -> list[TextIteration]:
    """Per iteration: decisions, accuracy and episode length logged, sampling and job wall times.

    The times come from the stage summaries (``sampling_seconds`` of ``sample_rollouts``,
    ``fine_tune_seconds`` of ``await_fine_tune_jobs``: see :mod:`nip_core.trainers.stages`).
    """
    out: dict[int, TextIteration] = {}

    def at(i: int) -> TextIteration:
        return out.setdefault(i, TextIteration(iteration=i))

    def value(row: dict[str, Any], key: str) -> float | None:
        v = row.get(key)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v else None

    for row in train:
        if "iteration" in row:
            it = at(int(row["iteration"]))
            it.valid_decision_rate = value(row, "valid_decision_rate")
            it.accuracy = value(row, "mean_accuracy")
            it.episode_length = value(row, "mean_episode_length")
    for row in test:
        if "iteration" in row and value(row, "test_mean_accuracy") is not None:
            at(int(row["iteration"])).test_accuracy = value(row, "test_mean_accuracy")
    for name in run.storage.listdir("stages"):
        if name.endswith("_sample_rollouts.json") or name.endswith("_await_fine_tune_jobs.json"):
            summary = run.read_json(f"stages/{name}", "stage summary")
            if "iteration" not in summary:
                continue
            it = at(int(summary["iteration"]))
            if name.endswith("_sample_rollouts.json"):
                # a summary without sampling_seconds predates it: its stage time is the sampling's
                took = summary.get("sampling_seconds", summary.get("seconds"))
                if isinstance(took, (int, float)):
                    it.sampling_s = float(took)
            elif name.endswith("_await_fine_tune_jobs.json"):
                it.fine_tune_s = {g: float(t) for g, t in (summary.get("fine_tune_seconds") or {}).items()}
    return [out[i] for i in sorted(out)]


def _precision(meta: dict[str, Any]) -> str | None:
    """``"<used> (<why>)"`` as the TensorDict trainer recorded it (``rl.precision``), else None."""
    record = meta.get("precision")
    if not isinstance(record, dict) or not record.get("used"):
        return None
    return f"{record['used']} ({record.get('why') or 'rl.precision'})"


def _wandb_location(meta: dict[str, Any]) -> str | None:
    run_id = meta.get("wandb_run_id")
    if not run_id:
        return None
    if meta.get("wandb_url"):
        return str(meta["wandb_url"])
    project = meta.get("wandb_project", "nipflow")
    if meta.get("wandb_mode") == "offline":
        base = meta.get("wandb_dir") or "."
        found = sorted(glob.glob(os.path.join(base, "wandb", f"offline-run-*-{run_id}")))
        where = found[-1] if found else os.path.join(base, "wandb")
        return f"offline run {run_id}: {where}  (upload with wandb sync)"
    return f"project {project}, run {run_id} ({meta.get('wandb_mode', 'online')})"


def _runs_dir_of(run: Any) -> str:
    location = run.location.rstrip("/")
    if not location.endswith(run.run_id):
        return location
    return location[:-len(run.run_id)].rstrip("/") or "/"


def result_card(run: Any, *, status: str | None = None, message: str | None = None) -> ResultCard:
    """Build the result card of ``run`` from what its run store holds.

    Parameters
    ----------
    run
        An opened run (:class:`nip_core.runs.Run`), e.g. ``RunStore(d).open_run(run_id)``.
    status, message
        How the caller saw the run end (``"failed"`` and the error, ...); by default the
        status recorded by the latest invocation (``"not started"`` without one).
    """
    params = run.params
    meta = run.metadata() if run.exists("metadata.json") else {}
    invocations = list(meta.get(INVOCATIONS_KEY) or [])
    latest = invocations[-1] if invocations else {}
    durations = [_seconds_between(i.get("started"), i.get("ended")) for i in invocations]
    finished = [d for d in durations if d is not None]
    state = _state(run)
    rows = run.read_metrics()
    train = [r for r in rows if r.get("kind", "train") == "train"]
    test = [r for r in rows if r.get("kind") == "test"]
    # time-outs wrong where the run logged it (docs/behaviour.md#b15), else nip's accuracy
    train_acc, train_it = _last_value(train, ("mean_decided_accuracy", "mean_accuracy", "verifier.train_accuracy"))
    test_acc, test_it = _last_value(test, ("test_mean_decided_accuracy", "test_mean_accuracy",
                                           "verifier.test_accuracy", "mean_accuracy"))
    text_run = params.trainer.startswith("pure_text")
    jobs = _fine_tune_jobs(run) if text_run else []
    runs_dir = _runs_dir_of(run)
    report = run.storage.url("report/summary.md")
    report_command = f"nipflow report {run.run_id} --runs-dir {shlex.quote(runs_dir)}"
    return ResultCard(
        run_id=run.run_id,
        status=status or latest.get("status") or ("running" if latest else "not started"),
        message=message if status else (message or latest.get("message")),
        scenario=params.scenario, trainer=params.trainer, protocol=params.interaction_protocol,
        dataset=params.dataset, params_hash=run.params_hash,
        iterations_done=int(state.get("iteration", 0)), iterations_planned=int(params.rl.num_iterations),
        started=latest.get("started"), ended=latest.get("ended"),
        wall_time_s=durations[-1] if durations else None,
        total_wall_time_s=sum(finished) if finished else None, invocations=len(invocations),
        final_train_accuracy=train_acc, final_train_iteration=train_it,
        final_test_accuracy=test_acc, final_test_iteration=test_it,
        precision=_precision(meta), text_run=text_run, fine_tune_jobs=sum(j.attempts for j in jobs) if text_run else None,
        trained_tokens=sum(j.trained_tokens or 0 for j in jobs) if text_run else None, jobs=jobs,
        per_iteration=_text_iterations(run, train, test) if text_run else [],
        run_store=run.location, report=report, report_written=run.exists("report/summary.md"),
        report_command=report_command, wandb=_wandb_location(meta),
        prefect_ui=latest.get("prefect_ui"), flow_run_id=latest.get("flow_run_id"),
    )


def local_ui_command(runs_dir: str) -> str:
    """The command that serves the local Prefect history kept in ``<runs_dir>/.prefect``."""
    return f"nipflow ui --runs-dir {shlex.quote(runs_dir)}"

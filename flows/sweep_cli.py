"""``nipflow sweep``: run the ``sweep`` flow through Prefect from a sweep file, then compare.

A sweep file is JSON::

    {"title": "...", "description": "...", "baseline": "nip",
     "variants": {"nip": {"interaction_protocol": "nip"},
                  "zk_nip": {"interaction_protocol": "nip", "protocol_common.zero_knowledge": true}},
     "grid": {"seed": [1, 2, 3]}}

Every variant runs with every grid point, on top of the base experiment given like
``nipflow run``'s (``--params FILE`` and/or ``--scenario``/``--trainer``, ``--set``); each
point is a ``train_experiment`` child flow run with its own run id ``<sweep-id>-<index>``
(points in the order variants x grid). Without ``PREFECT_API_URL`` the flow runs against
the temporary local server whose history ``nipflow ui`` shows, like ``nipflow run``.
Afterwards the comparison (mean ± std of the final verifier accuracy per variant, every
run's value, a plot beside it) is written to ``--out``, with the command line and the
sweep's wall time, and a comparison card is printed. With ``baseline`` (a variant's name)
both also give every other variant's difference from it, with its spread
(:func:`nip_core.logging.comparison.differences`). ``--evaluate DATASET_FILE`` (graph
isomorphism, repeatable) then tests every completed point's final checkpoint on that file,
every pair once, and adds a section per file to the comparison: accuracy per variant, the
differences from the baseline, accuracy by WL score and a plot of it
(:mod:`nip_core.logging.held_out`); a file that cannot be read is refused before anything
trains. Running a sweep again with the same id continues each point's run, as ``nipflow run
--run-id`` does; on a finished sweep that only re-reads the runs (and evaluates them).
"""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path
from typing import Any

from nip_core.errors import NipflowError


class SweepFileError(NipflowError):
    """A sweep file that cannot be used (names the file and the field)."""


def add_sweep_parser(sub, add_run_options) -> None:
    sweep = sub.add_parser("sweep", help="run a sweep file's variants x grid through Prefect and compare them")
    sweep.add_argument("sweep_file", help="JSON file with 'variants' and/or 'grid' (and 'title', 'description')")
    sweep.add_argument("--params", help="JSON file of the base hyper-parameters")
    sweep.add_argument("--scenario", choices=["graph_isomorphism", "code_validation"],
                       help="scenario of the base (overrides the params file's)")
    sweep.add_argument("--trainer", help="trainer of the base (overrides the params file's)")
    sweep.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="dotted override of the base, e.g. rl.num_iterations=10 (repeatable)")
    sweep.add_argument("--sweep-id", required=True, help="prefix of the points' run ids")
    sweep.add_argument("--out", help="markdown file of the comparison (the plot is written beside it, "
                                     "as .png); default <runs_dir>/<sweep-id>-comparison.md")
    sweep.add_argument("--evaluate", action="append", default=[], metavar="DATASET_FILE",
                       help="after the sweep, test every point's final checkpoint on this graph-isomorphism "
                            "data.pt too (every pair once; accuracy and accuracy by WL score in the comparison; "
                            "repeatable)")
    add_run_options(sweep)


def load_sweep_file(path: str) -> dict[str, Any]:
    """The sweep file's content, checked: ``variants`` maps names to override dicts, ``grid`` keys to lists."""
    try:
        content = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise SweepFileError(f"sweep file {path}: no such file") from None
    except json.JSONDecodeError as e:
        raise SweepFileError(f"sweep file {path}: not valid JSON ({e})") from None
    if not isinstance(content, dict):
        raise SweepFileError(f"sweep file {path}: expected a JSON object")
    unknown = sorted(set(content) - {"title", "description", "baseline", "variants", "grid"})
    if unknown:
        raise SweepFileError(f"sweep file {path}: unknown field {unknown[0]!r} "
                             "(expected title, description, baseline, variants, grid)")
    variants, grid = content.get("variants") or {}, content.get("grid") or {}
    if not isinstance(variants, dict) or not all(isinstance(v, dict) for v in variants.values()):
        raise SweepFileError(f"sweep file {path}: 'variants' must map names to objects of overrides")
    if not isinstance(grid, dict) or not all(isinstance(v, list) and v for v in grid.values()):
        raise SweepFileError(f"sweep file {path}: 'grid' must map dotted keys to non-empty lists")
    if not variants and not grid:
        raise SweepFileError(f"sweep file {path}: neither 'variants' nor 'grid' given: nothing to sweep")
    baseline = content.get("baseline")
    if baseline is not None and baseline not in variants:
        raise SweepFileError(f"sweep file {path}: 'baseline' {baseline!r} is not one of the variants "
                             f"{sorted(variants)}")
    return {"title": content.get("title") or Path(path).stem, "description": content.get("description", ""),
            "baseline": baseline, "variants": variants or None, "grid": grid}


def cmd_sweep(args, settings_for) -> int:
    """Run the sweep, write the comparison, print its card; exit 1 if a point did not complete."""
    from nip_core.experiment import make_params
    from nip_core.logging.comparison import collect, comparison_card, differences, summary_rows, write_comparison
    from nip_core.logging.held_out import held_out_card_row
    from nip_core.runs import RunStore, validate_run_id

    spec = load_sweep_file(args.sweep_file)
    if not (args.params or args.scenario):
        raise SweepFileError("nipflow sweep: give the base experiment with --params FILE and/or --scenario")
    base_params = make_params(args.scenario, args.trainer, params_file=args.params, overrides=args.overrides)
    settings = settings_for(args, validate_run_id(args.sweep_id))
    out = args.out or str(Path(settings.runs_dir) / f"{args.sweep_id}-comparison.md")
    if Path(out).suffix != ".md":
        raise SweepFileError(f"--out {out}: expected a markdown file name ending in .md")
    _check_evaluate_files(args.evaluate, base_params)
    started = time.monotonic()
    rows = run_sweep_through_prefect(base_params, settings, spec)
    wall = time.monotonic() - started
    store = RunStore(settings.runs_dir)
    labelled = [(row.get("variant") or _point_label(row, spec["grid"]), row["run_id"]) for row in rows]
    command = "nipflow " + " ".join(shlex.quote(a) for a in args.command_line)
    groups = collect(store, labelled)
    trained = sum(t for g in groups for t in g.wall_times_s)
    preamble = "\n".join([spec["description"], "",
                          f"Produced by `{command}` in {wall / 60:.1f} min of wall time "
                          f"({len(rows)} runs, sweep `{args.sweep_id}`); the runs' own wall times, over every "
                          f"invocation that trained them, add up to {trained / 60:.1f} min.", ""])
    baseline = spec["baseline"]
    path = write_comparison(store, labelled, out, title=spec["title"], preamble=preamble, baseline=baseline)
    counted = {run_id for g in groups for run_id in g.counted}
    evaluations = [(file, evaluate_points(store, [(label, r) for label, r in labelled if r in counted], file))
                   for file in args.evaluate]
    _append_held_out_sections(path, evaluations, baseline)
    if args.json:
        found = [vars(d) for d in differences(groups, baseline)] if baseline else []
        print(json.dumps({"sweep_id": args.sweep_id, "wall_time_s": wall, "comparison": str(path),
                          "groups": summary_rows(groups), "differences": found,
                          "evaluations": [_evaluation_json(file, results, baseline)
                                          for file, results in evaluations]}, indent=2))
    else:
        runs = ", ".join(row["run_id"] for row in rows)
        extra = [held_out_card_row(results, file, k) for k, (file, results) in enumerate(evaluations, 1) if results]
        extra.append(("runs", f"{runs} (nipflow status RUN --runs-dir {shlex.quote(str(settings.runs_dir))})"))
        ui = _prefect_ui(store, rows)
        if ui:
            extra.append(("Prefect UI", ui))
        print(comparison_card(groups, title=args.sweep_id, wall_time_s=wall, out=str(path), baseline=baseline,
                              extra=extra))
    return 0 if all(row["state"] == "Completed" for row in rows) else 1


def _check_evaluate_files(files: list[str], base_params) -> None:
    """Refuse, before anything trains, an ``--evaluate`` file that cannot be read or a non-GI base."""
    if not files:
        return
    from nip_core.scenarios.graph_isomorphism.original_format import read_dataset_file
    from nip_core.scenarios.graph_isomorphism.raw_data import GraphIsomorphismDataError

    if base_params.scenario != "graph_isomorphism":
        raise SweepFileError(f"--evaluate: tests graph-isomorphism runs on a dataset file; this sweep's scenario is "
                             f"{base_params.scenario}")
    for file in files:
        try:
            read_dataset_file(file)
        except GraphIsomorphismDataError as error:
            raise SweepFileError(f"--evaluate {file}: {error}") from None


def evaluate_points(store, labelled: list[tuple[str, str]], dataset_file: str) -> list[tuple[str, int, dict]]:
    """``(label, seed, evaluate_run's result)`` of every completed point on ``dataset_file``."""
    from nip_core.evaluation import evaluate_run

    return [(label, int(store.open_run(run_id).params.seed), evaluate_run(run_id, dataset_file, str(store.base)))
            for label, run_id in labelled]


def _append_held_out_sections(path: Path, evaluations, baseline: str | None) -> None:
    from nip_core.logging.held_out import file_label, held_out_section, plot_by_wl_score

    lines: list[str] = []
    for k, (file, results) in enumerate(evaluations, 1):
        if not results:
            lines += [f"## Held-out file `{file}`", "", "No completed run to evaluate.", ""]
            continue
        plot = path.with_name(f"{path.stem}-heldout-{k}.png")
        drawn = plot_by_wl_score(results, plot, f"accuracy by WL score: {file_label(file)}")
        lines += held_out_section(results, dataset_file=file, baseline=baseline, plot_name=plot.name if drawn else None)
    if lines:
        path.write_text(path.read_text().rstrip("\n") + "\n\n" + "\n".join(lines))


def _evaluation_json(file: str, results, baseline: str | None) -> dict[str, Any]:
    from nip_core.logging.comparison import differences, summary_rows
    from nip_core.logging.held_out import accuracy_by_wl_score, held_out_groups

    groups = held_out_groups(results)
    _, counts, means = accuracy_by_wl_score(results)
    return {"dataset_file": file, "groups": summary_rows(groups),
            "differences": [vars(d) for d in differences(groups, baseline)] if baseline and groups else [],
            "pairs_by_wl_score": counts, "accuracy_by_wl_score": means}


def _prefect_ui(store, rows: list[dict[str, Any]]) -> str | None:
    """Where the points' flow runs are seen, as their result cards say (the first point's)."""
    from nip_core.logging.result_card import result_card

    first = rows[0]["run_id"] if rows else None
    return result_card(store.open_run(first)).prefect_ui if first and store.exists(first) else None


def _point_label(row: dict[str, Any], grid: dict[str, list[Any]]) -> str:
    """Without variants: the grid values other than the seed name the group."""
    keys = [k for k in sorted(grid) if k != "seed"]
    return ", ".join(f"{k}={row.get(k)}" for k in keys) or "all"


def run_sweep_through_prefect(params, settings, spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Run the ``sweep`` flow for ``spec`` on top of ``params``/``settings``; return its rows."""
    from flows.entry import experiment_parameters, in_local_prefect

    def run() -> list[dict[str, Any]]:
        from flows.sweep import sweep

        # the points' run ids derive from the sweep id: the base has none
        base = experiment_parameters(params, settings).model_copy(update={"run_id": None})
        state = sweep(grid=spec["grid"], sweep_id=settings.run_id, dispatch="subflow", variants=spec["variants"],
                      **base.flow_parameters(), return_state=True)
        if not state.is_completed():
            raise NipflowError(f"sweep {settings.run_id}: flow run ended {state.name}: {state.message}")
        return state.result()

    return in_local_prefect(settings, run)

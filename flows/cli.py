"""The ``nipflow`` command.

``nipflow run`` drives the Prefect flow by default (``--direct`` runs the trainer
in-process); ``params``, ``status``, ``report`` and ``api-server`` only use nip_core.
Bad input exits with status 2 and one line on stderr naming the option, never a traceback
or a prompt: argparse's errors are one line (:class:`nip_core.utils.cli_args.ArgumentParser`),
and every command checks its inputs (:mod:`flows.cli_inputs`) before it starts or writes
anything. ``run``, ``resume`` and ``sweep`` stop on SIGTERM and SIGHUP as on Ctrl-C and
exit 128 + the signal's number (:func:`flows.signals.stop_like_ctrl_c`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
from typing import Sequence

from flows.cli_inputs import UsageError, check_location, check_runs_dir
from nip_core.errors import NipflowError
from nip_core.parameters import ParameterError
from nip_core.utils.cli_args import ArgumentParser, host, non_negative_int, port

__all__ = ["UsageError", "build_parser", "main"]


def _add_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs-dir", help="base location of the run store (default ./runs or $NIPFLOW_RUNS_DIR)")
    p.add_argument("--direct", action="store_true", help="run the trainer in-process, without Prefect")
    p.add_argument("--no-wandb", action="store_true", help="do not log to Weights & Biases")
    p.add_argument("--device", default=None, help="torch device for TensorDict trainers (cpu, cuda, cuda:1)")
    p.add_argument("--progress", choices=["auto", "on", "off"], default="auto")
    p.add_argument("--checkpoint-every", type=non_negative_int, default=None, metavar="N",
                   help="TensorDict trainers: checkpoint every N iterations (default 10)")
    p.add_argument("--json", action="store_true",
                   help="print only the result card, as JSON, on stdout (not the card and the run id)")


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="nipflow", description=__doc__.split("\n\n")[0])
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="start (or continue) an experiment")
    run.add_argument("scenario", choices=["graph_isomorphism", "code_validation"])
    run.add_argument("trainer")
    run.add_argument("--protocol", help="interaction protocol (nip, adp, debate, mnip, merlin_arthur, solo_verifier)")
    run.add_argument("--dataset")
    run.add_argument("--params", help="JSON file of hyper-parameters (overridden by the other options)")
    run.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                     help="dotted override, e.g. rl.num_iterations=50 (repeatable)")
    run.add_argument("--run-id", help="run id; an existing run with equal params is continued")
    run.add_argument("--on-params-mismatch", choices=["refuse", "warn", "force"], default="refuse")
    _add_run_options(run)

    resume = sub.add_parser("resume", help="continue a stopped or crashed run")
    resume.add_argument("run_id")
    restore = resume.add_mutually_exclusive_group()
    restore.add_argument("--from-wandb", nargs="?", const="", default=None, metavar="ENTITY/PROJECT/RUN_ID",
                         help="first rebuild the lost run store entry from its W&B run's artifacts "
                              "(default: the W&B run named RUN_ID in the project)")
    restore.add_argument("--wandb-dir", metavar="PATH",
                         help="first rebuild the lost run store entry from an offline W&B run directory "
                              "(wandb/offline-run-...) or a directory holding them")
    _add_run_options(resume)

    status = sub.add_parser("status", help="where a run stands")
    status.add_argument("run_id")
    status.add_argument("--runs-dir")
    status.add_argument("--json", action="store_true")

    evaluate = sub.add_parser("evaluate", help="test a graph-isomorphism run's final checkpoint on a dataset file")
    evaluate.add_argument("run_id")
    evaluate.add_argument("--dataset-file", required=True, metavar="PATH",
                          help="data.pt in the original library's format or nipflow's")
    evaluate.add_argument("--runs-dir")
    evaluate.add_argument("--mode", choices=["pairs", "test_loop"], default="pairs",
                          help="pairs: every pair once (default); test_loop: the trainer's own test loop")
    evaluate.add_argument("--device", default="cpu", help="torch device (cpu, cuda, auto)")
    evaluate.add_argument("--transcripts", type=int, default=0, metavar="N",
                          help="pairs mode: print the messages of the first N isomorphic pairs and the first N "
                               "non-isomorphic pairs of each WL score")
    evaluate.add_argument("--pictures", metavar="DIR",
                          help="with --transcripts: draw each transcript as DIR/pair_<id>.png")
    evaluate.add_argument("--json", action="store_true", help="print only a JSON object")

    params = sub.add_parser("params", help="show or validate hyper-parameters")
    psub = params.add_subparsers(dest="params_command", required=True)
    show = psub.add_parser("show", help="print the full parameter tree (defaults filled in)")
    show.add_argument("file", nargs="?")
    show.add_argument("--scenario")
    show.add_argument("--trainer")
    show.add_argument("--protocol")
    show.add_argument("--set", dest="overrides", action="append", default=[])
    show.add_argument("--describe", action="store_true",
                      help="one line per field: dotted.path: type = value  # description")
    validate = psub.add_parser("validate", help="validate a JSON parameter file")
    validate.add_argument("file")
    validate.add_argument("--set", dest="overrides", action="append", default=[])

    from flows.sweep_cli import add_sweep_parser

    add_sweep_parser(sub, _add_run_options)

    report = sub.add_parser("report", help="plots and a markdown summary of a run or a sweep")
    report.add_argument("run_id", nargs="+")
    report.add_argument("--out")
    report.add_argument("--runs-dir")

    api = sub.add_parser("api-server", help="the local OpenAI-compatible server (`api-server stop` stops one)",
                         add_help=False)
    api.add_argument("args", nargs=argparse.REMAINDER)

    ui = sub.add_parser("ui", help="the Prefect UI on the flow history of local runs (<runs_dir>/.prefect)")
    ui.add_argument("--runs-dir", help="the local run store (default ./runs or $NIPFLOW_RUNS_DIR)")
    ui.add_argument("--host", type=host, default="127.0.0.1", help="address to listen on (0.0.0.0: all)")
    ui.add_argument("--port", type=port, default=4200, metavar="P", help="API and UI port (default 4200)")

    worker = sub.add_parser("worker", help="prefect worker start ARGS, stopped by one SIGTERM (docs/deployment.md)",
                            add_help=False)
    worker.add_argument("args", nargs=argparse.REMAINDER)

    prefect = sub.add_parser("prefect", help="Prefect set-up (work pools, limits, automations)")
    prefect_sub = prefect.add_subparsers(dest="prefect_command", required=True)
    setup = prefect_sub.add_parser("setup")
    setup.add_argument("--gpus", type=non_negative_int, default=1,
                       help="size of the 'gpu' tag concurrency limit (0: a machine without GPUs)")
    server = prefect_sub.add_parser("server", help="prefect server start on PostgreSQL (docs/deployment.md)")
    server.add_argument("--data-dir", default="prefect-server", metavar="D",
                        help="holds the PostgreSQL cluster (D/postgres) and PREFECT_HOME (D/prefect-home)")
    server.add_argument("--host", type=host, default="127.0.0.1", help="address the API listens on (0.0.0.0: all)")
    server.add_argument("--port", type=port, default=4200, metavar="P", help="API and UI port (default 4200)")
    server.add_argument("--pg-port", type=port, metavar="Q", help="PostgreSQL port (default: a free one)")
    server.add_argument("--database-url", metavar="URL",
                        help="an existing PostgreSQL database (postgresql+asyncpg://...) instead of a cluster")
    return parser


def _settings(args, run_id: str | None):
    """The settings of ``run``/``resume``/``sweep``, checked: a bad option is a UsageError naming it."""
    from flows.cli_inputs import check_device_here, make_settings

    values = {"run_id": run_id}
    if getattr(args, "runs_dir", None) is not None:
        values["runs_dir"] = args.runs_dir
    if getattr(args, "no_wandb", False):
        values["use_wandb"] = False
    if getattr(args, "device", None) is not None:
        values["device"] = args.device
    if getattr(args, "checkpoint_every", None) is not None:
        values["checkpoint_every"] = args.checkpoint_every
    progress = getattr(args, "progress", "auto")
    values["show_progress"] = None if progress == "auto" else progress == "on"
    if getattr(args, "on_params_mismatch", None):
        values["on_params_mismatch"] = args.on_params_mismatch
    settings = make_settings(values)
    check_runs_dir(args, settings.runs_dir, write=True)
    check_device_here(settings.device)
    return settings


def cmd_run(args) -> int:
    from flows.cli_inputs import check_dataset, check_params_match
    from nip_core.experiment import make_params, new_run_id
    from nip_core.runs import validate_run_id

    params = make_params(args.scenario, args.trainer, protocol=args.protocol, dataset=args.dataset,
                         params_file=args.params, overrides=args.overrides)
    run_id = validate_run_id(args.run_id) if args.run_id is not None else new_run_id(params)
    settings = _settings(args, run_id)
    check_dataset(params, settings.data_dir)
    check_params_match(settings, params)  # before Prefect starts: the flow would refuse it too
    return _execute(params, settings, direct=args.direct, as_json=args.json)


def cmd_resume(args) -> int:
    from nip_core.runs import RunStore

    from nip_core.runs import validate_run_id

    settings = _settings(args, validate_run_id(args.run_id))
    if args.from_wandb is not None or args.wandb_dir:
        from flows.cli_inputs import check_wandb_path
        from nip_core.wandb_restore import restore_from_offline_dir, restore_from_wandb

        check_wandb_path(args.from_wandb)
        store = RunStore(settings.runs_dir)
        if store.exists(args.run_id):
            raise UsageError(f"--{'wandb-dir' if args.wandb_dir else 'from-wandb'}: run {args.run_id!r} exists in "
                             f"{settings.runs_dir}: nothing to restore (`nipflow resume {args.run_id}` continues it)")
        if args.wandb_dir:
            restored = restore_from_offline_dir(store, args.run_id, args.wandb_dir)
        else:
            project = settings.wandb_project or os.environ.get("WANDB_PROJECT") or "nipflow"
            restored = restore_from_wandb(store, args.run_id, args.from_wandb or None, project=project)
        print(f"nipflow: {restored.describe()}", file=sys.stderr)
    params = RunStore(settings.runs_dir).load_params(args.run_id)
    return _execute(params, settings, direct=args.direct, as_json=args.json)


def _execute(params, settings, direct: bool, as_json: bool = False) -> int:
    """Train (in-process or through Prefect), then print the result card and the run id.

    The run id stays the last line on stdout (scripts read it); with ``as_json`` only the
    card is printed, as JSON. A run that started training and then failed, was preempted
    or interrupted prints its card too, with what happened, before ``main`` exits with
    that error's status.
    """
    from nip_core.runs.invocations import outcome_of

    before = _invocations(settings)
    try:
        if direct:
            _train_direct(params, settings)
        else:
            from flows.entry import run_through_prefect

            run_through_prefect(params, settings)
    except BaseException as e:
        if _invocations(settings) > before:  # it got as far as training
            # A flow run recorded how it ended (more precisely than its FlowRunFailedError).
            recorded = not direct and not isinstance(e, KeyboardInterrupt) and _latest_ended(settings)
            _print_card(settings, as_json, *((None, None) if recorded else outcome_of(e)))
        raise
    _print_card(settings, as_json)
    if not as_json:
        print(settings.run_id)
    return 0


def _train_direct(params, settings) -> None:
    """``Trainer.train()`` in this process, driving the run (lease, invocation record: ``driving_run``)."""
    from flows.signals import shield_active_stop
    from nip_core.runs.driving import driving_run
    from nip_core.trainers import build_trainer

    trainer = build_trainer(params, settings)
    print(f"run {settings.run_id}: {trainer.run.location if trainer.run.persistent else '(not stored)'}",
          file=sys.stderr)
    try:
        with driving_run(trainer, "direct"):  # one driver per run: waits for (or takes over) the lease
            try:
                trainer.train()
            except BaseException:
                shield_active_stop()  # preempted or failed: a signal must not cut the records short
                raise
    finally:
        trainer.close()


def _stored_run(settings):
    from nip_core.runs import RunStore

    store = RunStore(settings.runs_dir)
    return store.open_run(settings.run_id) if store.exists(settings.run_id) else None


def _invocations(settings) -> int:
    """How many invocations the run has recorded (0 if it does not exist or cannot be read)."""
    from nip_core.runs.invocations import invocation_count

    try:
        run = _stored_run(settings)
        return invocation_count(run) if run is not None else 0
    except (NipflowError, OSError, ValueError):
        return 0


def _latest_ended(settings) -> bool:
    from nip_core.runs.invocations import latest_invocation

    try:
        run = _stored_run(settings)
        return run is not None and "ended" in latest_invocation(run)
    except (NipflowError, OSError, ValueError):
        return False


def _print_card(settings, as_json: bool, status: str | None = None, message: str | None = None) -> None:
    from nip_core.logging.result_card import result_card

    try:
        run = _stored_run(settings)
        card = result_card(run, status=status, message=message) if run is not None else None
    except (NipflowError, OSError, ValueError) as e:  # the training's outcome stands
        print(f"nipflow: warning: no result card for run {settings.run_id}: {e}", file=sys.stderr)
        return
    if card is not None:
        print(card.to_json() if as_json else card.to_text(), flush=True)


def cmd_status(args) -> int:
    from nip_core.runs import RunStore
    from nip_core.status import format_status, run_status

    info = run_status(RunStore(check_runs_dir(args)), args.run_id)
    print(json.dumps(info, indent=2, sort_keys=True) if args.json else format_status(info))
    return 0


def cmd_params(args) -> int:
    from nip_core.experiment import make_params

    if args.params_command == "validate":
        params = make_params(params_file=args.file, overrides=args.overrides)
        print(f"{args.file}: valid (params hash {params.params_hash()})")
        return 0
    if not args.file and not (args.scenario and args.trainer):
        raise UsageError("params show needs a FILE, or --scenario and --trainer")
    params = make_params(args.scenario, args.trainer, protocol=args.protocol, params_file=args.file,
                         overrides=args.overrides)
    if args.describe:
        from nip_core.parameters.describe import describe_lines

        print("\n".join(describe_lines(params)))
        return 0
    print(json.dumps(params.to_dict(), indent=2, sort_keys=True))
    return 0


def cmd_report(args) -> int:
    from flows.cli_inputs import check_output_path
    from nip_core.logging.report import write_report
    from nip_core.runs import validate_run_id

    runs_dir = check_runs_dir(args)
    for run_id in args.run_id:
        validate_run_id(run_id)
    if args.out is not None:
        check_output_path(args.out, "--out", directory=True)
    out = write_report(args.run_id, runs_dir=runs_dir, out_dir=args.out)
    print(out)
    return 0


def cmd_evaluate(args) -> int:
    from flows.cli_inputs import check_evaluate_args
    from nip_core.evaluation import evaluate_run, format_evaluation

    runs_dir = check_runs_dir(args)
    check_evaluate_args(args)
    result = evaluate_run(args.run_id, args.dataset_file, runs_dir=runs_dir, mode=args.mode, device=args.device,
                          transcripts=args.transcripts)
    if args.pictures is not None:
        from nip_core.scenarios.graph_isomorphism.transcripts import render_transcripts

        render_transcripts(result["transcripts"], args.pictures)
    print(json.dumps(result, indent=2, sort_keys=True) if args.json else format_evaluation(result))
    return 0


def cmd_api_server(args) -> int:
    from nipflow_llm_server.server.cli import main as api_main

    return api_main(args.args)


def cmd_ui(args) -> int:
    from flows.local_ui import serve_ui
    from flows.prefect_pg_server import PrefectServerError

    runs_dir = check_runs_dir(args)
    try:
        return serve_ui(runs_dir, host=args.host, port=args.port)
    except PrefectServerError as e:
        raise UsageError(str(e)) from e


def cmd_worker(args) -> int:
    from flows.cli_inputs import check_worker_args
    from flows.worker import run_worker

    check_worker_args(args.args)
    return run_worker(args.args)


def cmd_prefect(args) -> int:
    if args.prefect_command == "server":
        from flows.prefect_pg_server import PrefectServerError, asyncpg_url, serve
        from nip_core.utils.hosts import is_loopback_host

        if not is_loopback_host(args.host) and not os.environ.get("PREFECT_SERVER_API_AUTH_STRING"):
            raise UsageError(f"--host {args.host}: the Prefect API (and the Secret block with the OpenAI key) "
                             "would answer anyone who reaches this machine; set PREFECT_SERVER_API_AUTH_STRING="
                             "user:password for the server and PREFECT_API_AUTH_STRING on clients and workers "
                             "(docs/deployment.md), or keep the default --host 127.0.0.1")
        if args.database_url is not None:
            try:
                asyncpg_url(args.database_url)
            except PrefectServerError as e:
                raise UsageError(f"--database-url: {e}") from None
        else:
            check_location(args.data_dir, "--data-dir", write=True)
        try:
            return serve(args.data_dir, host=args.host, port=args.port, pg_port=args.pg_port,
                         database_url=args.database_url)
        except PrefectServerError as e:
            raise UsageError(str(e)) from e
    from flows.prefect_setup import setup_prefect

    setup_prefect(gpus=args.gpus)
    return 0


def cmd_sweep(args) -> int:
    from flows.sweep_cli import cmd_sweep as run_sweep

    if args.direct:
        raise UsageError("nipflow sweep runs its points as Prefect flow runs: --direct is not available")
    from flows.cli_inputs import check_output_path, check_sweep_points

    if args.out is not None:
        check_output_path(args.out, "--out", directory=False)
    check_sweep_points(args)
    return run_sweep(args, _settings)


COMMANDS = {"run": cmd_run, "sweep": cmd_sweep, "resume": cmd_resume, "status": cmd_status, "params": cmd_params,
            "report": cmd_report, "api-server": cmd_api_server, "prefect": cmd_prefect,
            "evaluate": cmd_evaluate, "ui": cmd_ui, "worker": cmd_worker}


#: Commands that stop on SIGTERM and SIGHUP as on Ctrl-C (flows.signals.stop_like_ctrl_c).
STOPPABLE = ("run", "resume", "sweep")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["api-server"]:
        return cmd_api_server(argparse.Namespace(args=argv[1:]))
    if argv[:1] == ["worker"]:  # every option is prefect worker start's
        return _report_errors(cmd_worker, argparse.Namespace(args=argv[1:]))
    args = parser.parse_args(argv)
    args.command_line = argv  # what the user typed after `nipflow` (reports quote it)
    # A W&B service token inherited from a parent process (WANDB_SERVICE) would make this
    # process's runs live in the parent's W&B service: after a SIGKILL the run id stays
    # "in use" there and the resumed run cannot open it. Each nipflow process owns its own.
    os.environ.pop("WANDB_SERVICE", None)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.verbose:  # one INFO line per HTTP request drowns the progress bars
        for noisy in ("httpx", "httpx2", "httpcore", "openai"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
    from flows.signals import stop_like_ctrl_c

    with stop_like_ctrl_c() if args.command in STOPPABLE else contextlib.nullcontext() as stop:
        try:
            return _report_errors(COMMANDS[args.command], args)
        finally:
            if stop is not None:
                stop.shield()  # a second signal must not cut the clean-up short
            _release_llm_servers()


def _report_errors(command, args) -> int:
    """Run ``command(args)``; its input errors, a preemption or a stop become a line and an exit status.

    Only errors that name bad input or a state the user can act on (``NipflowError``,
    ``ParameterError``, ``UsageError``) are turned into ``nipflow: error: ...`` and status 2;
    anything else is a bug and keeps its traceback. Ctrl-C exits 130, SIGTERM 143 and
    SIGHUP 129 (128 + the signal's number, as a shell reports a process the signal killed).
    """
    from nip_core.errors import TrainingPreempted
    from nip_core.trainers.preemption import PREEMPTED_EXIT_CODE

    try:
        return command(args)
    except TrainingPreempted as e:  # checkpointed: `nipflow resume` continues exactly
        print(f"nipflow: {e}", file=sys.stderr)
        return PREEMPTED_EXIT_CODE
    except (ParameterError, NipflowError, UsageError) as e:
        print(f"nipflow: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        status = getattr(e, "exit_status", 130)
        print("nipflow: interrupted" if status == 130 else f"nipflow: {e}", file=sys.stderr, flush=True)
        return status


def _release_llm_servers() -> None:
    """Stop the local LLM servers this run started (success, failure or Ctrl-C alike)."""
    launcher = sys.modules.get("nipflow_llm_server.launcher")  # not imported: no server was started
    if launcher is not None:
        launcher.release_local_servers()  # logs what it stopped


if __name__ == "__main__":
    sys.exit(main())

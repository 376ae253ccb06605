"""Up-front checks of ``nipflow``'s inputs: each bad value becomes one line naming its option.

The commands call these before they start or write anything, so that bad input exits
with status 2 and one line on stderr (:class:`UsageError`), never a traceback, and leaves
an existing run store as it was. Errors of the training itself are not input errors and
are not caught here.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Sequence

from nip_core.utils.cli_args import directory_problem

#: ``ExperimentSettings`` fields set from command-line options, by option.
SETTING_OPTIONS = {"runs_dir": "--runs-dir", "device": "--device", "checkpoint_every": "--checkpoint-every",
                   "on_params_mismatch": "--on-params-mismatch", "show_progress": "--progress",
                   "use_wandb": "--no-wandb", "run_id": "--run-id", "data_dir": "$NIPFLOW_DATA_DIR"}
_SCHEME_LIKE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):")


class UsageError(Exception):
    """Bad command-line input (exit status 2); the message names the option."""


def _named(option: str, value: Any, default_from: str | None = None) -> str:
    source = f" (from ${default_from})" if default_from else ""
    return f"{option} {value}{source}"


def make_settings(values: dict[str, Any]):
    """``ExperimentSettings(**values)``; a rejected value is a :class:`UsageError` naming its option."""
    from pydantic import ValidationError

    from nip_core.settings import ExperimentSettings

    try:
        return ExperimentSettings(**values)
    except ValidationError as e:
        problems = []
        for error in e.errors():
            field = str(error["loc"][0]) if error.get("loc") else "settings"
            option = SETTING_OPTIONS.get(field, field)
            message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
            problems.append(f"{option} {error.get('input')!r}: {message}")
        raise UsageError("; ".join(problems)) from None


def check_location(location: str, option: str = "--runs-dir", *, write: bool,
                   default_from: str | None = None) -> None:
    """Check a run store location (a directory or an fsspec URL) before it is used.

    A URL must name a protocol that fsspec knows and whose package is installed; text that
    only looks like one (``s3:/x``) is refused rather than taken for a local directory. A
    local path must not lie below a regular file and, with ``write``, must be a directory
    that can be created (or exists) and written: a temporary directory is made and removed
    in its nearest existing ancestor, so nothing is left behind.
    """
    text = str(location)
    where = _named(option, text, default_from)
    if not text:
        raise UsageError(f"{option}: empty location (a directory or a URL such as s3://bucket/runs)")
    if "://" in text and not text.startswith("file://"):
        import fsspec

        try:
            fsspec.core.url_to_fs(text)
        except ImportError as e:
            raise UsageError(f"{where}: this URL's file system is not installed ({e})") from None
        except (ValueError, TypeError) as e:
            raise UsageError(f"{where}: not a run store URL that fsspec can open ({e})") from None
        return
    match = _SCHEME_LIKE.match(text)
    if match:
        raise UsageError(f"{where}: looks like a URL but has no '//' after {match.group(1)!r} "
                         f"(write {match.group(1)}://...; a local directory needs no scheme)")
    problem = directory_problem(text.removeprefix("file://"), write=write)
    if problem:
        raise UsageError(f"{where}: {problem}")


def check_runs_dir(args: Any, runs_dir: str | None = None, *, write: bool = False) -> str:
    """The run store location of a command (``--runs-dir``, else ``$NIPFLOW_RUNS_DIR`` or ./runs), checked."""
    from nip_core.settings import default_runs_dir

    given = getattr(args, "runs_dir", None)
    if runs_dir is None:
        runs_dir = default_runs_dir() if given is None else given
    from_env = "NIPFLOW_RUNS_DIR" if given is None and os.environ.get("NIPFLOW_RUNS_DIR") else None
    check_location(runs_dir, "--runs-dir", write=write, default_from=from_env)
    return runs_dir


def check_output_path(path: str, option: str, *, directory: bool) -> None:
    """``path`` (a file, or with ``directory`` a directory) can be written where it is."""
    if not path:
        raise UsageError(f"{option}: empty path")
    if not directory and Path(path).is_dir():
        raise UsageError(f"{option} {path}: is a directory, not a file")
    where = Path(path) if directory else Path(path).absolute().parent
    problem = directory_problem(where, write=True)
    if problem and not directory and not problem.startswith("cannot"):
        problem = f"{where} {problem}"  # about the file's directory
    if problem:
        raise UsageError(f"{option} {path}: {problem}")


def check_device_here(device: str, option: str = "--device") -> None:
    """A device other than ``auto`` must exist on this host (where a local run trains)."""
    from nip_core.settings import AUTO_DEVICE, DeviceUnavailableError, check_device_name, resolve_device

    try:
        check_device_name(device)
        if device != AUTO_DEVICE:
            resolve_device(device, field=option)
    except DeviceUnavailableError as e:
        raise UsageError(str(e)) from None
    except ValueError as e:
        raise UsageError(f"{option} {device!r}: {e}") from None


def check_evaluate_args(args: Any) -> None:
    """``nipflow evaluate``'s file, device, transcript count and picture directory."""
    if not Path(args.dataset_file).is_file():
        what = "is a directory" if Path(args.dataset_file).is_dir() else "raw data file does not exist"
        raise UsageError(f"--dataset-file {args.dataset_file}: {what}")
    check_device_here(args.device)
    if args.transcripts < 0:
        raise UsageError(f"--transcripts {args.transcripts}: a number of pairs per class, 0 or more")
    if args.pictures is not None:
        if not args.transcripts:
            raise UsageError("--pictures: draws transcripts; give --transcripts N too")
        check_output_path(args.pictures, "--pictures", directory=True)


def check_dataset(params: Any, data_dir: str, option: str = "--dataset") -> None:
    """The dataset of ``params`` is registered for its scenario (or, for graph isomorphism, cached)."""
    name = params.dataset
    if params.scenario == "code_validation":
        from nip_core.scenarios.code_validation.dataset.loader import dataset_names

        known = dataset_names()
        if name not in known:
            raise UsageError(f"{option} {name!r}: unknown code-validation dataset; registered: {', '.join(known)}")
    elif params.scenario == "graph_isomorphism":
        from nip_core.scenarios.graph_isomorphism.named_datasets import NAMED_DATASETS
        from nip_core.scenarios.graph_isomorphism.raw_data import raw_data_path

        cached = all(raw_data_path(data_dir, name, split).is_file() for split in ("train", "test"))
        if name not in NAMED_DATASETS and not cached:
            raise UsageError(f"{option} {name!r}: unknown graph-isomorphism dataset (registered: "
                             f"{', '.join(sorted(NAMED_DATASETS))}; or a name with train and test files "
                             f"under {Path(data_dir) / 'graph_isomorphism'})")


def check_params_match(settings: Any, params: Any) -> None:
    """With ``--on-params-mismatch refuse``, an existing run must have these parameters (checked read-only)."""
    from nip_core.errors import ParamsMismatchError
    from nip_core.parameters.hyper_parameters import diff_params
    from nip_core.runs import RunStore

    if settings.on_params_mismatch != "refuse":
        return
    store = RunStore(settings.runs_dir)
    if not store.exists(settings.run_id):
        return
    differing = diff_params(store.load_params(settings.run_id).to_dict(), params.to_dict())
    if differing:
        raise ParamsMismatchError(settings.run_id, differing,
                                  store.run_storage(settings.run_id).full("hyper_params.json"))


def check_wandb_path(path: str | None) -> None:
    """``--from-wandb``: empty (the run named like the nipflow run) or ``ENTITY/PROJECT/RUN_ID``."""
    if path and (len(path.split("/")) != 3 or not all(path.split("/"))):
        raise UsageError(f"--from-wandb {path}: expected ENTITY/PROJECT/RUN_ID (or no value: the W&B run "
                         "named like the nipflow run)")


def check_worker_args(args: Sequence[str]) -> None:
    """``nipflow worker ARGS``: ARGS must be valid ``prefect worker start`` options (parsed, not run).

    Prefect's own parser (cyclopts) checks names and types; a worker also needs ``--pool``
    (it would prompt for one on a terminal), a positive ``--limit`` and a readable
    ``--base-job-template``.
    """
    if any(a in ("--help", "-h") for a in args):
        return  # Prefect prints its own help
    import cyclopts

    from prefect.cli.worker import worker_app

    try:
        _, bound, _ = worker_app.parse_args(["start", *args], exit_on_error=False, print_error=False)
    except cyclopts.CycloptsError as e:
        raise UsageError(" ".join(str(e).split())) from None
    given = bound.arguments
    if not given.get("work_pool_name"):
        raise UsageError("--pool: the work pool to poll is required (--pool NAME)")
    for name, option, low in (("limit", "--limit", 1), ("prefetch_seconds", "--prefetch-seconds", 0)):
        if given.get(name) is not None and given[name] < low:
            raise UsageError(f"{option} {given[name]}: expected an integer >= {low}")
    template = given.get("base_job_template")
    if template is not None:
        import json

        try:
            json.loads(Path(template).read_text())
        except OSError as e:
            raise UsageError(f"--base-job-template {template}: cannot read ({e.strerror or e})") from None
        except ValueError as e:
            raise UsageError(f"--base-job-template {template}: not valid JSON ({e})") from None


def check_sweep_points(args: Any) -> None:
    """``nipflow sweep``: every point (base + variant + grid values) must be valid parameters.

    Checked before Prefect starts: a bad override in the sweep file would otherwise fail
    its points one by one inside the sweep flow. A missing or bad base is left to
    :func:`flows.sweep_cli.cmd_sweep`, which names it.
    """
    import json

    from flows.sweep import sweep_points
    from flows.sweep_cli import load_sweep_file
    from nip_core.experiment import make_params
    from nip_core.parameters import ParameterError
    from nip_core.settings import default_data_dir

    spec = load_sweep_file(args.sweep_file)
    if not (args.params or args.scenario):
        return
    make_params(args.scenario, args.trainer, params_file=args.params, overrides=args.overrides)
    where = f"sweep file {args.sweep_file}"
    try:
        points = sweep_points(spec["grid"], spec["variants"])
    except ValueError as e:
        raise UsageError(f"{where}: {e}") from None
    for name, point in points:
        overrides = [*args.overrides, *(f"{k}={json.dumps(v)}" for k, v in point.items())]
        label = f"variant {name!r}" if name else f"grid point {point}"
        try:
            params = make_params(args.scenario, args.trainer, params_file=args.params, overrides=overrides)
            check_dataset(params, default_data_dir(), option="dataset")
        except (ParameterError, UsageError) as e:
            raise UsageError(f"{where}, {label}: {e}") from None

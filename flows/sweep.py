"""``sweep``: a grid over parameters, one child flow run per point, and a summary table.

The points are the product of the named ``variants`` (each a set of overrides applied
together, e.g. ``{"zk_nip": {"interaction_protocol": "nip",
"protocol_common.zero_knowledge": true}}``) and the ``grid`` (dotted path -> values).

Deployed, the points are started through ``run_deployment`` without waiting, so any
worker serving the pool picks them up (two workers run two points at once); the sweep
then polls until all are final. Locally, the points run one after another as subflows.

Children get the base parameters plus overrides only: secrets can reach neither (the grid
is refused if a key names a secret settings field, and every child's parameters are
validated again); each child reads the API key on its worker (:mod:`flows.secret_blocks`).
"""

from __future__ import annotations

import itertools
import json
import time
from typing import Annotated, Any, Literal, Optional

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact
from prefect.client.orchestration import get_client
from prefect.deployments import run_deployment
from prefect.runtime import deployment
from pydantic import AfterValidator, Field

from flows.experiment import train_experiment
from flows.observability import artifact_key
from flows.form_fields import (
    DEFAULT_BLOCK_SIZE,
    BlockSizeField,
    DatasetField,
    DeviceField,
    FramesPerBatchField,
    NumIterationsField,
    OnParamsMismatchField,
    OverridesField,
    ParamsField,
    ProtocolField,
    ProverModelField,
    RolloutsField,
    RunsDirField,
    ScenarioField,
    SeedField,
    SettingsOverridesField,
    TrainerField,
    UseWandbField,
    VerifierModelField,
    WaitModeField,
    WarmStartFromField,
    described_by,
)
from flows.parameters import ExperimentParameters, refuse_secret_overrides
from flows.secret_blocks import SECRET_SETTINGS_FIELDS
from nip_core.runs import RunStore
from nip_core.settings import AUTO_DEVICE, default_runs_dir

POINT_DEPLOYMENT = "train_experiment/sweep-point"

# A grid key (dotted path) whose last part names a secret settings field is refused, by
# the validator in-process and by the JSON schema on a server enforcing deployment schemas.
_SECRET_PATH_PATTERN = "(^|\\.)(" + "|".join(sorted(SECRET_SETTINGS_FIELDS)) + ")$"


def _no_secret_grid_keys(grid: dict[str, list[Any]]) -> dict[str, list[Any]]:
    refuse_secret_overrides(list(grid), "grid")
    return grid


def _no_secret_variant_keys(variants: dict[str, dict[str, Any]] | None) -> dict[str, dict[str, Any]] | None:
    for name, overrides in (variants or {}).items():
        refuse_secret_overrides(list(overrides), f"variants.{name}")
    return variants


SweepGrid = Annotated[
    dict[str, list[Any]],
    AfterValidator(_no_secret_grid_keys),
    Field(json_schema_extra={"propertyNames": {"not": {"pattern": _SECRET_PATH_PATTERN}}}),
]

SweepVariants = Annotated[
    Optional[dict[str, dict[str, Any]]],
    AfterValidator(_no_secret_variant_keys),
    Field(description="Named sets of overrides applied together; the points are every variant "
                      "combined with every grid point (no variants: the grid alone)."),
]


def grid_points(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """All combinations of ``grid`` (dotted parameter path -> values), in a stable order.

    >>> grid_points({"seed": [1, 2], "rl.num_iterations": [5]})
    [{'rl.num_iterations': 5, 'seed': 1}, {'rl.num_iterations': 5, 'seed': 2}]
    """
    keys = sorted(grid)
    return [dict(zip(keys, values)) for values in itertools.product(*(grid[k] for k in keys))]


def sweep_points(grid: dict[str, list[Any]],
                 variants: dict[str, dict[str, Any]] | None = None) -> list[tuple[str | None, dict[str, Any]]]:
    """``(variant name, overrides)`` of every point: each variant (in the given order) with each grid point.

    >>> sweep_points({"seed": [1, 2]}, {"a": {"x": 0}, "b": {"x": 1}})
    [('a', {'x': 0, 'seed': 1}), ('a', {'x': 0, 'seed': 2}), ('b', {'x': 1, 'seed': 1}), ('b', {'x': 1, 'seed': 2})]
    """
    if not variants:
        return [(None, point) for point in grid_points(grid)]
    clash = sorted({k for overrides in variants.values() for k in overrides} & set(grid))
    if clash:
        raise ValueError(f"sweep: {clash[0]!r} is set both by a variant and by the grid")
    return [(name, {**overrides, **point}) for name, overrides in variants.items() for point in grid_points(grid)]


def point_parameters(base: ExperimentParameters, sweep_id: str, index: int,
                     point: dict[str, Any]) -> ExperimentParameters:
    overrides = list(base.overrides) + [f"{k}={json.dumps(v)}" for k, v in point.items()]
    # Validated again (model_copy would not be): a child's parameters pass the same
    # checks as a user's, secrets included.
    return ExperimentParameters.model_validate({**base.model_dump(), "overrides": overrides,
                                                "run_id": f"{sweep_id}-{index:03d}"})


def _final_metrics(runs_dir: str, run_id: str) -> dict[str, Any]:
    store = RunStore(runs_dir)
    if not store.exists(run_id):
        return {}
    rows = store.open_run(run_id).read_metrics()
    tests = [r for r in rows if r.get("kind") == "test"] or rows
    return {k: v for k, v in (tests[-1] if tests else {}).items() if k not in ("kind",)}


@flow(name="sweep", persist_result=True)
@described_by(ExperimentParameters)
def sweep(
    grid: SweepGrid,
    sweep_id: str,
    scenario: ScenarioField = None,
    trainer: TrainerField = None,
    protocol: ProtocolField = None,
    dataset: DatasetField = None,
    num_iterations: NumIterationsField = None,
    seed: SeedField = None,
    frames_per_batch: FramesPerBatchField = None,
    rollouts_per_iteration: RolloutsField = None,
    prover_model: ProverModelField = None,
    verifier_model: VerifierModelField = None,
    params: ParamsField = None,
    overrides: OverridesField = None,
    runs_dir: RunsDirField = None,
    device: DeviceField = AUTO_DEVICE,
    use_wandb: UseWandbField = False,
    block_size: BlockSizeField = DEFAULT_BLOCK_SIZE,
    wait_mode: WaitModeField = "auto",
    on_params_mismatch: OnParamsMismatchField = "refuse",
    warm_start_from: WarmStartFromField = None,
    settings_overrides: SettingsOverridesField = None,
    dispatch: Literal["auto", "subflow", "deployment"] = "auto",
    deployment_name: Optional[str] = None,
    variants: SweepVariants = None,
) -> list[dict[str, Any]]:
    """Train every point (``variants`` x ``grid``) on top of the base experiment; one summary row per point.

    The other parameters are the base experiment, as ``train_experiment`` takes them
    (every point has its own run id, ``<sweep_id>-<index>``).

    Args:
        grid: dotted parameter path -> the values it takes (e.g. {"seed": [1, 2, 3]})
        sweep_id: the sweep's name; point i is the run <sweep_id>-<i, three digits>
        dispatch: deployment: each point is a flow run of deployment_name (any worker of its pool
            takes it); subflow: the points run one after another in this process; auto: deployment
            when this flow run is deployed
        deployment_name: the deployment of the points (default train_experiment/sweep-point)
        variants: named sets of overrides applied together; the points are every variant combined
            with every grid point (no variants: the grid alone)
    """
    base = ExperimentParameters.from_flow_parameters(locals())
    log = get_run_logger()
    named_points = sweep_points(grid, variants)
    points = [point for _, point in named_points]
    deployed = dispatch == "deployment" or (dispatch == "auto" and deployment.id is not None)
    children = [point_parameters(base, sweep_id, i, p) for i, p in enumerate(points)]
    states: dict[str, str] = {}
    if deployed:
        started = {c.run_id: run_deployment(deployment_name or POINT_DEPLOYMENT,
                                            parameters=c.flow_parameters(mode="json"),
                                            timeout=0) for c in children}
        with get_client(sync_client=True) as client:
            while True:
                runs = {rid: client.read_flow_run(fr.id) for rid, fr in started.items()}
                if all(r.state and r.state.is_final() for r in runs.values()):
                    break
                time.sleep(5)
        states = {rid: r.state.name for rid, r in runs.items()}
    else:
        for c in children:
            states[c.run_id] = train_experiment(**c.flow_parameters(), return_state=True).name
    runs_dir = base.runs_dir or default_runs_dir()
    rows = [{"run_id": c.run_id, **({"variant": name} if name is not None else {}), **p,
             "state": states[c.run_id], **_final_metrics(runs_dir, c.run_id)}
            for c, (name, p) in zip(children, named_points)]
    create_table_artifact(table=rows, key=artifact_key(sweep_id, "sweep"), description=f"sweep {sweep_id}")
    log.info("sweep %s: %d points, %d completed", sweep_id, len(rows),
             sum(r["state"] == "Completed" for r in rows))
    return rows

"""``nipflow prefect setup``: what the deployments in ``deployments/`` need on the server.

Creates (idempotently) the process work pools ``nipflow-cpu`` and ``nipflow-gpu``, the
``gpu`` tag concurrency limit (one slot per GPU: RL blocks of two experiments never share
a GPU), the Secret block ``nipflow-openai-api-key`` from ``$OPENAI_API_KEY`` (when set;
the key itself is never logged), and the automations of ``deployments/automations.yaml``.

``--gpus N`` (N >= 1) sets the ``gpu`` limit to N. ``--gpus 0`` is a machine without
GPUs: no ``gpu`` limit is created, and one left by an earlier set-up is deleted (a limit
of 0 would keep every RL block waiting forever), so blocks of several experiments may run
at once. Every deployment then runs on the CPU: the device of RL blocks is the flow
parameter ``parameters.device``, ``auto`` by default, which each block resolves to the
CPU on a host without CUDA. Start a worker for *both* pools on that same machine::

    nipflow prefect setup --gpus 0
    prefect --no-prompt deploy --all --prefect-file deployments/prefect.yaml
    prefect worker start --pool nipflow-cpu &
    prefect worker start --pool nipflow-gpu &    # runs the RL blocks, on the CPU here
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import yaml

from nip_core.errors import NipflowError

log = logging.getLogger(__name__)

WORK_POOLS = {"nipflow-cpu": "CPU work: pure-text trainers, sweeps, the fine-tune watcher",
              "nipflow-gpu": "GPU work: TensorDict RL iteration blocks"}
GPU_TAG = "gpu"
OPENAI_SECRET_BLOCK = "nipflow-openai-api-key"
AUTOMATIONS_FILE = Path(__file__).resolve().parents[1] / "deployments" / "automations.yaml"


class SetupError(NipflowError, ValueError):
    """Invalid ``nipflow prefect setup`` arguments (the CLI exits 2 with this line)."""


def ensure_gpu_limit(client, gpus: int) -> int | None:
    """Make the ``gpu`` tag limit ``gpus`` slots; with ``gpus == 0`` make sure there is none.

    Returns the size of the limit that was deleted for ``gpus == 0`` (``None`` if there
    was none); ``None`` otherwise.
    """
    from prefect.exceptions import ObjectNotFound

    if gpus > 0:
        client.create_concurrency_limit(tag=GPU_TAG, concurrency_limit=gpus)  # creates or updates
        return None
    try:
        existing = client.read_concurrency_limit_by_tag(GPU_TAG)
    except ObjectNotFound:
        return None
    client.delete_concurrency_limit_by_tag(GPU_TAG)
    return existing.concurrency_limit


def ensure_work_pools(client) -> list[str]:
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists

    created = []
    for name, description in WORK_POOLS.items():
        try:
            client.create_work_pool(WorkPoolCreate(name=name, type="process", description=description))
            created.append(name)
        except ObjectAlreadyExists:
            pass
    return created


def ensure_openai_secret() -> bool:
    key = os.environ.get("OPENAI_API_KEY")
    if not key:
        return False
    from prefect.blocks.system import Secret

    Secret(value=key).save(OPENAI_SECRET_BLOCK, overwrite=True)
    return True


def load_automations(path: Path = AUTOMATIONS_FILE) -> list[Any]:
    from prefect.automations import Automation

    return [Automation.model_validate(spec) for spec in yaml.safe_load(path.read_text())["automations"]]


#: what an automation does (its name and id aside)
_DEFINITION_FIELDS = ("description", "trigger", "actions", "enabled")


def _definition(automation) -> Any:
    """What an automation does, comparable across processes (its sets, e.g. ``expect``,
    dump as lists in a per-process order: sorted here)."""
    def normal(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: normal(v) for k, v in value.items() if k != "id"}
        if isinstance(value, list):
            items = [normal(v) for v in value]
            return sorted(items, key=json.dumps) if all(isinstance(v, str) for v in items) else items
        return value

    return normal(automation.model_dump(mode="json", include=set(_DEFINITION_FIELDS)))


def ensure_automations(path: Path = AUTOMATIONS_FILE) -> tuple[list[str], list[str]]:
    """Create the automations of ``path`` that the server lacks, and update those whose
    trigger, actions or description differ from the file (a server set up by an older
    version). Returns the names created and the names updated."""
    from prefect.automations import Automation

    created, updated = [], []
    for automation in load_automations(path):
        try:
            existing = Automation.read(name=automation.name)
        except Exception:  # noqa: BLE001 - not found (Prefect raises ValueError/ObjectNotFound)
            automation.create()
            created.append(automation.name)
            continue
        if _definition(existing) != _definition(automation):
            for field in _DEFINITION_FIELDS:
                setattr(existing, field, getattr(automation, field))
            existing.update()
            updated.append(automation.name)
    return created, updated


def setup_prefect(gpus: int = 1) -> dict[str, Any]:
    """Create the pools, the ``gpu`` limit, the OpenAI secret and the automations.

    ``gpus=0``: a CPU-only machine, no ``gpu`` limit (an existing one is deleted). Returns
    what was done (``gpu_limit`` is ``None`` without a limit; ``gpu_limit_removed`` the
    size of a deleted one), and prints one line per item.

    Raises
    ------
    SetupError
        If ``gpus`` is negative.
    """
    if gpus < 0:
        raise SetupError(f"--gpus must be 0 (a machine without GPUs) or more, got {gpus}")
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        pools = ensure_work_pools(client)
        removed = ensure_gpu_limit(client, gpus)
    secret = ensure_openai_secret()
    automations, updated = ensure_automations()
    report = {"work_pools_created": pools, "gpu_limit": gpus or None, "gpu_limit_removed": removed,
              "openai_secret": secret, "automations_created": automations, "automations_updated": updated}
    print(f"work pools: {', '.join(WORK_POOLS)} (created: {', '.join(pools) or 'none'})")
    if gpus:
        print(f"'{GPU_TAG}' tag concurrency limit: {gpus}")
    else:
        print(f"'{GPU_TAG}' tag concurrency limit: none (--gpus 0: "
              + (f"deleted the existing limit of {removed}; " if removed is not None else "")
              + "RL blocks run on the CPU, start a worker for both nipflow-cpu and nipflow-gpu on this machine)")
    print(f"secret block {OPENAI_SECRET_BLOCK}: {'saved' if secret else 'skipped (OPENAI_API_KEY not set)'}")
    print(f"automations created: {', '.join(automations) or 'none (already present)'}"
          + (f"; updated: {', '.join(updated)}" if updated else ""))
    return report

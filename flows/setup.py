"""``nipflow prefect setup``: what the deployments in ``deployments/`` need on the server.

Creates (idempotently) the process work pools ``nipflow-cpu`` and ``nipflow-gpu``, the
``gpu`` tag concurrency limit (one slot per GPU: RL blocks of two experiments never share
a GPU), the Secret block ``nipflow-openai-api-key`` from ``$OPENAI_API_KEY`` (when set;
the key itself is never logged), and the automations of ``deployments/automations.yaml``.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import yaml

log = logging.getLogger(__name__)

WORK_POOLS = {"nipflow-cpu": "CPU work: pure-text trainers, sweeps, the fine-tune watcher",
              "nipflow-gpu": "GPU work: TensorDict RL iteration blocks"}
GPU_TAG = "gpu"
OPENAI_SECRET_BLOCK = "nipflow-openai-api-key"
AUTOMATIONS_FILE = Path(__file__).resolve().parents[1] / "deployments" / "automations.yaml"


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


def ensure_automations(path: Path = AUTOMATIONS_FILE) -> list[str]:
    from prefect.automations import Automation

    created = []
    for automation in load_automations(path):
        try:
            Automation.read(name=automation.name)
            continue
        except Exception:  # noqa: BLE001 - not found (Prefect raises ValueError/ObjectNotFound)
            pass
        automation.create()
        created.append(automation.name)
    return created


def setup_prefect(gpus: int = 1) -> dict[str, Any]:
    """Create the pools, the ``gpu`` limit, the OpenAI secret and the automations.

    Returns what was done, and prints one line per item.
    """
    if gpus < 1:
        raise ValueError(f"--gpus must be at least 1, got {gpus}")
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        pools = ensure_work_pools(client)
        client.create_concurrency_limit(tag=GPU_TAG, concurrency_limit=gpus)
    secret = ensure_openai_secret()
    automations = ensure_automations()
    report = {"work_pools_created": pools, "gpu_limit": gpus, "openai_secret": secret,
              "automations_created": automations}
    print(f"work pools: {', '.join(WORK_POOLS)} (created: {', '.join(pools) or 'none'})")
    print(f"'{GPU_TAG}' tag concurrency limit: {gpus}")
    print(f"secret block {OPENAI_SECRET_BLOCK}: {'saved' if secret else 'skipped (OPENAI_API_KEY not set)'}")
    print(f"automations created: {', '.join(automations) or 'none (already present)'}")
    return report

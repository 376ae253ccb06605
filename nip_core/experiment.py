"""Building an experiment's parameters from CLI-like inputs, and running it in-process."""

from __future__ import annotations

import json
import secrets
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from nip_core.parameters import HyperParameters, ParameterError, apply_overrides

# Datasets used when the user names none.
DEFAULT_DATASETS = {"graph_isomorphism": "small", "code_validation": "nipflow-cv"}


def make_params(
    scenario: str | None = None,
    trainer: str | None = None,
    *,
    protocol: str | None = None,
    dataset: str | None = None,
    params_file: str | Path | None = None,
    overrides: Iterable[str] = (),
) -> HyperParameters:
    """Assemble and validate ``HyperParameters``.

    Precedence (lowest first): a params file, then the positional scenario / trainer /
    ``--protocol`` / ``--dataset``, then each ``--set key.path=value`` override.
    """
    data: dict[str, Any] = {}
    source = None
    if params_file is not None:
        source = str(params_file)
        try:
            data = json.loads(Path(params_file).read_text())
        except OSError as e:
            raise ParameterError([("<file>", f"cannot read: {e.strerror}")], source) from None
        except json.JSONDecodeError as e:
            raise ParameterError([("<file>", f"not valid JSON (line {e.lineno}: {e.msg})")], source) from None
    if scenario:
        data["scenario"] = scenario
    if trainer:
        data["trainer"] = trainer
    if protocol:
        data["interaction_protocol"] = protocol
    if dataset:
        data["dataset"] = dataset
    if "dataset" not in data and data.get("scenario") in DEFAULT_DATASETS:
        data["dataset"] = DEFAULT_DATASETS[data["scenario"]]
    data = apply_overrides(data, overrides)
    return HyperParameters.from_dict(data, source=source)


def new_run_id(params: HyperParameters) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    return f"{params.scenario[:2]}-{params.trainer}-{params.interaction_protocol}-{stamp}-{secrets.token_hex(2)}"

"""Hyper-parameters taken from a base run (``base_run.base_run_type``).

``"parameters"`` and ``"rerun_tests"`` start from the base run's hyper-parameters; the
fields annotated ``BaseRunPreserve(<type>)`` keep the current value for that type (for
``rerun_tests``: ``rl.num_test_iterations``, ``rl.test_greedy``, ``text_rl.test_scheme``,
``text_rl.test_on_whole_dataset``), and the ``base_run`` group itself is always the
current one. ``"none"`` returns the parameters unchanged.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from nip_core.parameters.base import BaseRunPreserve
from nip_core.parameters.hyper_parameters import HyperParameters


def preserved_fields(model: BaseModel, base_run_type: str, prefix: str = "") -> dict[str, Any]:
    """Dotted paths (and current values) of the fields of ``model`` preserved for ``base_run_type``."""
    out: dict[str, Any] = {}
    for name, info in type(model).model_fields.items():
        value = getattr(model, name)
        if any(isinstance(m, BaseRunPreserve) and base_run_type in m.base_run_types for m in info.metadata):
            out[prefix + name] = value
        elif isinstance(value, BaseModel):
            out.update(preserved_fields(value, base_run_type, f"{prefix}{name}."))
    return out


def merge_with_base_run(current: HyperParameters, base: HyperParameters) -> HyperParameters:
    """``base``'s parameters with ``current``'s preserved fields and ``base_run`` group."""
    kind = current.base_run.base_run_type
    if kind == "none":
        return current
    data = base.model_dump(mode="json")
    data["base_run"] = current.base_run.model_dump(mode="json")
    for path, value in preserved_fields(current, kind).items():
        node = data
        *parents, leaf = path.split(".")
        for part in parents:
            node = node[part]
        node[leaf] = value.model_dump(mode="json") if isinstance(value, BaseModel) else value
    # the base run's stored parameters: loaded as stored (a run made before a refusal still serves as a base)
    return HyperParameters.from_dict(data, source=f"base run '{current.base_run.run_id}' + current preserved fields",
                                     stored=True)

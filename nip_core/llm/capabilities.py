"""Can the API behind a client fine-tune a model with a method? Ask before spending rollouts.

:func:`check_fine_tunable` lists the server's models (``GET /v1/models``) and decides:

* **servers that say so**: the local server (every engine) adds
  ``"capabilities": {"fine_tuning": {"supervised": bool, "dpo": bool}}`` to each model entry
  (next to OpenAI's ``id`` / ``object`` / ``created`` / ``owned_by``); those fields decide;
* **the OpenAI API**, whose entries carry no such field: the table
  :data:`OPENAI_FINE_TUNING` below decides, for the model or, for an ``ft:`` model, the
  base it names. It lists what this project relies on, from OpenAI's fine-tuning and
  deprecations pages: ``gpt-4o-mini-2024-07-18`` (the default ``model_name``) supervised
  only; the gpt-4.1 family (``gpt-4.1-2025-04-14``, ``gpt-4.1-mini-2025-04-14``,
  ``gpt-4.1-nano-2025-04-14``) supervised and DPO. OpenAI accepts no new fine-tuning jobs
  after **2027-01-06** (gpt-4o-mini-2024-07-18 retires in January 2027): a check against
  the table always warns about that date (:class:`OpenAIFineTuningEndWarning`).

A model the server does not list, or a method it (or the table) does not offer, raises
:class:`ModelNotFineTunableError`, naming the model, the method and the base URL.
"""

from __future__ import annotations

import datetime as dt
import logging
import warnings
from typing import Any

from nip_core.errors import NipflowError

log = logging.getLogger(__name__)

METHODS = ("supervised", "dpo")
#: The last day OpenAI accepts new fine-tuning jobs (OpenAI's deprecations page).
OPENAI_JOBS_END = dt.date(2027, 1, 6)
#: Fine-tuning methods OpenAI offers per base snapshot (see the module docstring).
OPENAI_FINE_TUNING: dict[str, dict[str, bool]] = {
    "gpt-4o-mini-2024-07-18": {"supervised": True, "dpo": False},
    "gpt-4.1-2025-04-14": {"supervised": True, "dpo": True},
    "gpt-4.1-mini-2025-04-14": {"supervised": True, "dpo": True},
    "gpt-4.1-nano-2025-04-14": {"supervised": True, "dpo": True},
}


class ModelNotFineTunableError(NipflowError):
    """The API at ``base_url`` cannot fine-tune ``model`` with ``method`` (``reason`` says why)."""

    def __init__(self, model: str, method: str, base_url: str, reason: str):
        self.model = model
        self.method = method
        self.base_url = base_url
        self.reason = reason
        super().__init__(f"model {model!r} cannot be fine-tuned with method {method!r} at {base_url}: {reason}")


class OpenAIFineTuningEndWarning(FutureWarning):
    """OpenAI's fine-tuning API accepts no new jobs after :data:`OPENAI_JOBS_END`."""


def _capabilities(entry: Any) -> dict[str, Any] | None:
    extra = getattr(entry, "model_extra", None) or {}
    caps = extra.get("capabilities")
    return caps if isinstance(caps, dict) else None


def table_base(model: str) -> str:
    """The base snapshot of a model id: ``ft:BASE:org:suffix:id`` -> ``BASE``."""
    if model.startswith("ft:"):
        parts = model.split(":")
        if len(parts) > 1 and parts[1]:
            return parts[1]
    return model


def check_fine_tunable(client: Any, model: str, method: str) -> dict[str, bool]:
    """Raise unless the API behind ``client`` can fine-tune ``model`` with ``method``.

    Parameters
    ----------
    client
        An ``openai.OpenAI`` client (the local server's or OpenAI's).
    model
        The model a job would start from (a base model or an ``ft:`` model).
    method
        ``supervised`` or ``dpo``.

    Returns
    -------
    dict
        The fine-tuning capabilities that decided (``{"supervised": bool, "dpo": bool}``).

    Raises
    ------
    ModelNotFineTunableError
        An unknown method; a model the server does not list; a method the server's
        capability fields, or the OpenAI table, do not offer for it.
    """
    base_url = str(client.base_url)
    if method not in METHODS:
        raise ModelNotFineTunableError(model, method, base_url, f"unknown method; expected one of {', '.join(METHODS)}")
    entries = list(client.models.list())
    entry = next((e for e in entries if e.id == model), None)
    if any(_capabilities(e) is not None for e in entries):
        if entry is None:
            raise ModelNotFineTunableError(model, method, base_url, "the server does not list this model")
        tuning = (_capabilities(entry) or {}).get("fine_tuning") or {}
        if not tuning.get(method):
            offered = [m for m in METHODS if tuning.get(m)] or ["none"]
            raise ModelNotFineTunableError(
                model, method, base_url, f"the server offers these methods for it: {', '.join(offered)}")
        return {m: bool(tuning.get(m)) for m in METHODS}
    return _check_with_table(model, method, base_url, entry is not None)


def _check_with_table(model: str, method: str, base_url: str, listed: bool) -> dict[str, bool]:
    message = (f"OpenAI accepts no new fine-tuning jobs after {OPENAI_JOBS_END.isoformat()} (its deprecations page); "
               f"fine-tuning {model!r} at {base_url} stops working then. The local server "
               "(nipflow api-server --engine transformers) keeps fine-tuning available.")
    warnings.warn(message, OpenAIFineTuningEndWarning, stacklevel=3)
    log.warning(message)
    if not listed:
        raise ModelNotFineTunableError(model, method, base_url, "the server does not list this model")
    base = table_base(model)
    offered = OPENAI_FINE_TUNING.get(base)
    if offered is None:
        raise ModelNotFineTunableError(
            model, method, base_url,
            f"{base} is not a fine-tunable base in the OpenAI table (known: {', '.join(OPENAI_FINE_TUNING)})")
    if not offered[method]:
        having = [name for name, caps in OPENAI_FINE_TUNING.items() if caps[method]]
        raise ModelNotFineTunableError(
            model, method, base_url, f"OpenAI offers {method} only for {', '.join(having)}")
    return dict(offered)


def offers_structured_output(client: Any, model: str) -> bool:
    """Whether the server lists ``model`` with ``capabilities.structured_output``: nipflow's
    transformers and vLLM engines do (they enforce ``response_format``, ``guided_regex`` and
    ``guided_choice``); the selection engine and OpenAI's entries do not."""
    import openai

    try:
        entry = client.models.retrieve(model)
    except openai.NotFoundError:
        return False
    return bool((_capabilities(entry) or {}).get("structured_output"))

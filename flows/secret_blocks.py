"""Secrets of flow runs: where the OpenAI API key comes from, and where it may never go.

A secret is never a flow parameter: Prefect stores parameters in plain text in its
database, shows them in the UI and copies them into child runs (sweep points, RL blocks).
Flows therefore take the key from the worker instead, when they build their
``ExperimentSettings``:

1. ``$OPENAI_API_KEY`` of the process running the flow (wins when set), else
2. the Prefect Secret block ``nipflow-openai-api-key`` (``nipflow prefect setup`` saves it
   from ``$OPENAI_API_KEY``). A missing block means no key; any other failure to read it
   is logged (without the value) and also means no key, so a run that never calls the
   API (TensorDict trainers, the local server) is not stopped by it.

:data:`SECRET_SETTINGS_FIELDS` (the ``SecretStr`` fields of ``ExperimentSettings``) is
what :mod:`flows.parameters` refuses in flow parameters. Since the key goes wherever the
run's API base URL points, and the run store is written with the worker's credentials,
:func:`with_secrets` also refuses an API base URL or a run store the worker does not trust
(docs/deployment.md#what-a-flow-run-may-point-a-worker-at).
"""

from __future__ import annotations

import logging
import os
import types
import typing
from typing import Any

from pydantic import SecretBytes, SecretStr

from flows.prefect_setup import OPENAI_SECRET_BLOCK
from nip_core.settings import ExperimentSettings
from nip_core.utils.hosts import is_loopback_url

log = logging.getLogger(__name__)

OPENAI_KEY_ENV = "OPENAI_API_KEY"
OPENAI_BASE_URL = "https://api.openai.com/v1"
ALLOWED_API_URLS_ENV = "NIPFLOW_ALLOWED_API_BASE_URLS"
ALLOWED_RUNS_DIRS_ENV = "NIPFLOW_ALLOWED_RUNS_DIRS"


def _holds_secret(annotation: Any) -> bool:
    """Whether a type annotation is, or contains (``SecretStr | None``), a pydantic secret."""
    if isinstance(annotation, type) and issubclass(annotation, (SecretStr, SecretBytes)):
        return True
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType or origin is typing.Annotated:
        return any(_holds_secret(arg) for arg in typing.get_args(annotation))
    return False


#: Fields of ``ExperimentSettings`` typed as secrets: never accepted from flow parameters.
SECRET_SETTINGS_FIELDS: frozenset[str] = frozenset(
    name for name, field in ExperimentSettings.model_fields.items() if _holds_secret(field.annotation))


def secret_parameter_error(path: str) -> str:
    """The message refusing a secret given as a flow parameter at ``path``."""
    return (f"{path}: secrets are not accepted as flow parameters; set {OPENAI_KEY_ENV} on the worker "
            f"or run `nipflow prefect setup` to store it in the Secret block '{OPENAI_SECRET_BLOCK}'")


def _prefect_api_available() -> bool:
    """Whether a Prefect API is there to ask, without starting a temporary server.

    Inside a flow or task run the run's own API is (also Prefect's temporary local
    server); outside, only a configured ``PREFECT_API_URL`` is used.
    """
    from prefect.context import FlowRunContext, TaskRunContext
    from prefect.settings import PREFECT_API_URL

    return bool(PREFECT_API_URL.value()) or FlowRunContext.get() is not None or TaskRunContext.get() is not None


def _is_missing_block(error: BaseException) -> bool:
    from prefect.exceptions import ObjectNotFound

    # Block.load reports a missing document (or an unregistered Secret type) as a
    # ValueError raised from ObjectNotFound.
    return isinstance(error, ObjectNotFound) or isinstance(error.__cause__, ObjectNotFound)


def secret_from_block(name: str) -> SecretStr | None:
    """The value of the Prefect Secret block ``name``, or None if it cannot be had.

    Never raises for an unavailable block and never logs the value (only the error's type
    is logged: a validation error message could quote it).
    """
    try:
        if not _prefect_api_available():
            log.debug("no Prefect API configured: the Secret block %r is not read", name)
            return None
        from prefect.blocks.system import Secret

        value = Secret.load(name, _sync=True).get()
    except Exception as error:  # noqa: BLE001 - no key is a valid outcome; the trainer says if it needs one
        if _is_missing_block(error):
            log.debug("no Secret block %r on the Prefect server", name)
        else:
            log.warning("could not read the Prefect Secret block %r (%s); continuing without its value",
                        name, type(error).__name__)
        return None
    if value is None or value == "":
        return None
    return SecretStr(str(value))


def openai_api_key() -> SecretStr | None:
    """The OpenAI API key for this flow run: ``$OPENAI_API_KEY``, else the Secret block."""
    env = os.environ.get(OPENAI_KEY_ENV)
    if env:
        return SecretStr(env)
    return secret_from_block(OPENAI_SECRET_BLOCK)


def _under(value: str, prefixes: list[str]) -> bool:
    value = value.rstrip("/")
    return any(value == p.rstrip("/") or value.startswith(p.rstrip("/") + "/") for p in prefixes if p.strip())


def allowed_api_base_urls() -> list[str]:
    """Where this worker sends its key besides loopback: OpenAI, ``$OPENAI_BASE_URL``, the allowlist."""
    extra = [u.strip() for u in os.environ.get(ALLOWED_API_URLS_ENV, "").split(",") if u.strip()]
    own = os.environ.get("OPENAI_BASE_URL")
    return [OPENAI_BASE_URL, *([own] if own else []), *extra]


def check_api_base_url(url: str | None, field: str = "settings_overrides.openai_base_url") -> None:
    """Refuse an API base URL from a flow run's parameters that this worker does not trust.

    The worker sends its OpenAI key to the run's API base URL, so a flow run may only
    choose a loopback URL (a server on the worker's own host), OpenAI's, the worker's own
    ``$OPENAI_BASE_URL`` or one under an entry of ``$NIPFLOW_ALLOWED_API_BASE_URLS``
    (comma-separated) of the worker.

    Raises
    ------
    ValueError
        Naming ``field``, the URL and how to allow it.
    """
    if not url or is_loopback_url(url) or _under(url, allowed_api_base_urls()):
        return
    raise ValueError(f"{field}: {url!r} is not an API base URL this worker sends its key to (loopback, "
                     f"{OPENAI_BASE_URL}, its own OPENAI_BASE_URL and {ALLOWED_API_URLS_ENV} are); "
                     f"add it to {ALLOWED_API_URLS_ENV} on the worker to allow it")


def check_run_store_allowed(runs_dir: str, field: str = "runs_dir") -> None:
    """Refuse a run store outside ``$NIPFLOW_ALLOWED_RUNS_DIRS`` of the worker, when that is set.

    Entries are comma-separated local directories or URLs (``s3://bucket/prefix``); a
    local ``runs_dir`` is compared after resolving it (``..`` and links cannot leave an
    entry). Unset, any run store is accepted (the worker's files and credentials are then
    the flow run's to use: set it on shared workers).
    """
    entries = [e.strip() for e in os.environ.get(ALLOWED_RUNS_DIRS_ENV, "").split(",") if e.strip()]
    if not entries:
        return
    local = "://" not in runs_dir
    candidate = os.path.realpath(runs_dir) if local else runs_dir
    allowed = [os.path.realpath(e) if "://" not in e else e for e in entries]
    if not _under(candidate, allowed):
        raise ValueError(f"{field}: {runs_dir!r} is outside the run stores this worker writes to "
                         f"({ALLOWED_RUNS_DIRS_ENV}: {', '.join(entries)})")


def with_secrets(settings: ExperimentSettings) -> ExperimentSettings:
    """``settings`` with its secrets set from the worker's sources (never from parameters).

    The API base URL and the run store the settings name are checked first
    (:func:`check_api_base_url`, :func:`check_run_store_allowed`): parameters come from whoever
    can start a flow run, the key and the files are the worker's.
    """
    check_api_base_url(settings.openai_base_url)
    check_run_store_allowed(str(settings.runs_dir))
    settings.openai_api_key = openai_api_key()
    return settings

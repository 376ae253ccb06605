"""Checkpoint files of a run: written in the safetensors + JSON format, read in it or as an
older pickle that loads safely (:mod:`nip_core.trainers.checkpoint_legacy`).

The trainers, warm start and evaluation read and write checkpoints through these functions
only; the run store (:meth:`nip_core.runs.store.Run.save_checkpoint_bytes`) keeps each file
with its sha256 manifest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

import torch

from nip_core.errors import CheckpointNotFoundError, CorruptCheckpointError
from nip_core.trainers.checkpoint_format import (
    FORMAT,
    MANIFEST_FORMAT,
    decode_checkpoint,
    encode_checkpoint,
    is_checkpoint_format,
)
from nip_core.trainers.checkpoint_legacy import is_pickled, load_pickled_checkpoint

if TYPE_CHECKING:
    from nip_core.runs import Run


def read_checkpoint(data: bytes, *, source: str, map_location: str | torch.device | None = None) -> Any:
    """The state of a checkpoint file, in this format or a safely loadable older pickle.

    Parameters are those of :func:`decode_checkpoint`.

    Raises
    ------
    UnsafeCheckpointError
        If ``data`` is a pickle that ``torch.load(weights_only=True)`` refuses even with
        nipflow's allowlist: the message names ``source`` and the command that converts it.
    CorruptCheckpointError
        If ``data`` is neither (names ``source``).
    """
    if is_checkpoint_format(data):
        return decode_checkpoint(data, source=source, map_location=map_location)
    if is_pickled(data):
        return load_pickled_checkpoint(data, source=source, map_location=map_location)
    raise CorruptCheckpointError(source, f"neither a {FORMAT} safetensors file nor a pickled checkpoint")


def run_checkpoint_source(run: "Run", name: str) -> str:
    """The checkpoint file ``name`` of ``run``, as errors name it (path or URL)."""
    try:
        return run.storage.url(run.checkpoint_data_rel(name))
    except (CheckpointNotFoundError, CorruptCheckpointError):
        return run.storage.url(f"checkpoints/{name}.pt")


def save_run_checkpoint(run: "Run", name: str, state: Mapping[str, Any] | bytes, **info: Any) -> str:
    """Store ``state`` (or bytes from :func:`encode_checkpoint`) as ``run``'s checkpoint ``name``.

    The run store writes the file and its sha256 manifest, each once; the manifest also
    records ``format`` (:data:`MANIFEST_FORMAT`) and ``info``. Returns the data file's path
    in the run (for a run that stores nothing, the path it would have had).
    """
    data = state if isinstance(state, bytes) else encode_checkpoint(state)
    return run.save_checkpoint_bytes(name, data, format=MANIFEST_FORMAT, **info)


def load_run_checkpoint(run: "Run", name: str, *,
                        map_location: str | torch.device | None = None) -> tuple[Any, dict[str, Any]]:
    """``(state, manifest)`` of ``run``'s checkpoint ``name``, verified by the run store first.

    Raises
    ------
    CheckpointNotFoundError, CorruptCheckpointError
        From the run store (missing file, sha256 or params hash mismatch) and from
        :func:`read_checkpoint`; ``UnsafeCheckpointError`` for a pickle that is not safe.
    """
    data, manifest = run.load_checkpoint_bytes(name)
    return read_checkpoint(data, source=run_checkpoint_source(run, name), map_location=map_location), manifest

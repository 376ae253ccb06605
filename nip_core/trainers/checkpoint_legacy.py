"""Pickled checkpoints of earlier nipflow versions: safe loading, or a one-time conversion.

Before checkpoints were safetensors + JSON (:mod:`nip_core.trainers.checkpoint_format`),
nipflow wrote them with ``torch.save``: a pickle. Such a file is loaded only through
``torch.load(weights_only=True)``, which builds tensors and plain containers and refuses
any other object, with this explicit allowlist on top (scoped to the call, nothing is
added globally):

* numpy's array reconstruction and its numeric dtypes (numpy's RNG state is an array):
  ``numpy.ndarray``, ``numpy.dtype``, ``numpy.dtypes.<numeric>DType`` and
  ``numpy[._]core.multiarray._reconstruct``;
* the two names a pickled ``TensorDict`` uses (the carried-over episodes), mapped to
  nipflow's own stand-ins: ``tensordict._td.TensorDict`` to a marker class and
  ``tensordict._reductions._make_td`` to :func:`_rebuild_tensordict`, which builds a
  ``TensorDict`` of tensors (and nested ``TensorDict`` s) only and refuses anything else.

A checkpoint written by nipflow before this change holds nothing else, so it loads, with a
warning naming the file (the next checkpoint the run writes is in the new format). A pickle
that needs anything outside the allowlist is refused with
:class:`~nip_core.trainers.checkpoint_format.UnsafeCheckpointError`, naming the file and
the command that converts it. Loading never falls back to ``weights_only=False`` on its own.

Converting (``python -m nip_core.trainers.checkpoint_legacy --trust PATH ...``, or
:func:`convert_pickled_checkpoint`) is the explicit opt-in for a file you trust: it unpickles
the file with ``torch.load(weights_only=False)`` — which runs whatever code the pickle holds,
so run it only on checkpoints you wrote yourself — and rewrites it, with its manifest (new
sha256 and size, ``format``, ``converted_from``), in the safe format. Run it while no
process is driving the run.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import logging
import pickle
import posixpath
import re
import sys
from datetime import datetime, timezone
from typing import Any

import numpy as np
import torch

from nip_core.errors import CorruptCheckpointError
from nip_core.runs.store import json_record_bytes
from nip_core.trainers.checkpoint_format import (
    MANIFEST_FORMAT,
    UnsafeCheckpointError,
    decode_checkpoint,
    encode_checkpoint,
    is_checkpoint_format,
)

log = logging.getLogger(__name__)

_NUMPY_DTYPES = ("Bool", "Int8", "UInt8", "Int16", "UInt16", "Int32", "UInt32", "Int64", "UInt64", "Byte",
                 "UByte", "Short", "UShort", "Int", "UInt", "Long", "ULong", "LongLong", "ULongLong",
                 "Float16", "Float32", "Float64")
_UNSUPPORTED = re.compile(r"Unsupported global: GLOBAL ([\w.]+)|got <class '([\w.]+)'>")


def convert_command(source: str) -> str:
    return f"python -m nip_core.trainers.checkpoint_legacy --trust {source}"


def is_pickled(data: bytes) -> bool:
    """Whether ``data`` looks like ``torch.save`` output (a zip archive, or a legacy pickle)."""
    return data[:4] == b"PK\x03\x04" or data[:1] == b"\x80"


class _PickledTensorDict:
    """Stands for ``tensordict._td.TensorDict`` in an old pickle; never instantiated with state."""

    __slots__ = ()


def _rebuild_tensordict(cls: Any, state: Any):
    """Stand-in of ``tensordict._reductions._make_td``: a ``TensorDict`` of tensors only."""
    from tensordict import TensorDict

    if cls is not _PickledTensorDict or not isinstance(state, dict):
        raise pickle.UnpicklingError("a pickled TensorDict with unexpected contents")
    entries = state.get("_tensordict")
    batch_size = state.get("_batch_size")
    device = state.get("_device")
    names = state.get("_td_dim_names")
    if (not isinstance(entries, dict) or not isinstance(batch_size, torch.Size)
            or not (device is None or isinstance(device, torch.device))
            or not (names is None or (isinstance(names, list) and all(n is None or isinstance(n, str)
                                                                      for n in names)))
            or not all(isinstance(k, str) and isinstance(v, (torch.Tensor, TensorDict)) for k, v in entries.items())):
        raise pickle.UnpicklingError("a pickled TensorDict with unexpected contents")
    # map_location moved the tensors already: the TensorDict goes where they are.
    first = next((v.device for v in entries.values() if v.device is not None), None)
    if device is not None and first is not None:
        device = first
    td = TensorDict(dict(entries), batch_size=batch_size, device=device)
    if names is not None and any(n is not None for n in names):
        td.names = names
    if state.get("_is_locked") is True:
        td.lock_()
    return td


def _allowlist() -> list:
    reconstruct = np._core.multiarray._reconstruct if hasattr(np, "_core") else np.core.multiarray._reconstruct
    dtypes = [getattr(np.dtypes, f"{name}DType") for name in _NUMPY_DTYPES if hasattr(np.dtypes, f"{name}DType")]
    return [np.ndarray, np.dtype, *dtypes,
            (reconstruct, "numpy._core.multiarray._reconstruct"), (reconstruct, "numpy.core.multiarray._reconstruct"),
            (_PickledTensorDict, "tensordict._td.TensorDict"),
            (_rebuild_tensordict, "tensordict._reductions._make_td")]


def _restricted_load(data: bytes, source: str, map_location) -> Any:
    """``torch.load(weights_only=True)`` with the allowlist; UnsafeCheckpointError if it refuses."""
    try:
        with torch.serialization.safe_globals(_allowlist()):
            return torch.load(io.BytesIO(data), weights_only=True, map_location=map_location)
    except pickle.UnpicklingError as e:
        found = _UNSUPPORTED.search(str(e))
        what = (f"the global {next(g for g in found.groups() if g)!r}" if found
                else "objects other than tensors and plain data")
        raise UnsafeCheckpointError(
            source, f"a pickled checkpoint (nipflow's format before safetensors + JSON) that needs {what}, "
                    "which torch.load(weights_only=True) does not allow: unpickling it could run code stored in "
                    f"the file. If you trust this file, convert it once with: {convert_command(source)}") from None
    except Exception as e:  # noqa: BLE001 - a truncated archive and the like
        raise CorruptCheckpointError(source, f"cannot be loaded ({type(e).__name__}: {e})") from None


def load_pickled_checkpoint(data: bytes, *, source: str, map_location=None) -> Any:
    """The state of an old pickled checkpoint, loaded safely (see the module docstring).

    Raises
    ------
    UnsafeCheckpointError
        If the pickle holds anything outside the allowlist (names ``source`` and the command
        that converts it).
    CorruptCheckpointError
        If it cannot be read at all.
    """
    state = _restricted_load(data, source, map_location)
    log.warning("%s: a pickled checkpoint of an earlier nipflow, loaded with torch.load(weights_only=True); "
                "checkpoints are now written as safetensors + JSON (to rewrite this one: %s)", source,
                convert_command(source))
    return state


# -- one-time conversion ------------------------------------------------------------------------


def _split(path: str) -> tuple[str, str]:
    if "://" in path:
        directory, name = posixpath.split(path)
    else:
        import os

        directory, name = os.path.split(os.path.abspath(path))
    if not name.endswith(".pt"):
        raise ValueError(f"{path}: not a checkpoint file (<name>.pt beside its <name>.json manifest)")
    return directory, name[:-3]


def convert_pickled_checkpoint(path: str, *, trust: bool = False) -> str:
    """Rewrite the pickled checkpoint ``path`` (and its manifest beside it) in the safe format.

    Parameters
    ----------
    path
        ``.../checkpoints/<name>.pt`` or ``.../warm_start/<name>.pt``: a local path or an
        fsspec URL; ``<name>.json`` beside it is its manifest.
    trust
        Unpickle with ``torch.load(weights_only=False)`` when the safe load refuses the
        file. This runs any code the pickle holds: only for files you trust.

    Returns
    -------
    str
        ``"converted"``, or ``"already"`` when the file is in the new format already.

    Raises
    ------
    CorruptCheckpointError
        If the file does not match its manifest's sha256, or cannot be read.
    UnsafeCheckpointError
        If the safe load refuses the file and ``trust`` is false.
    """
    from nip_core.runs.storage import Storage

    directory, name = _split(path)
    storage = Storage(directory)
    manifest_rel, data_rel = f"{name}.json", f"{name}.pt"
    source = storage.url(data_rel)
    try:
        manifest = json.loads(storage.read_bytes(manifest_rel))
        data = storage.read_bytes(data_rel)
    except FileNotFoundError as e:
        raise CorruptCheckpointError(source, f"missing {e.filename or 'file'} (a checkpoint and its manifest "
                                             "are converted together)") from None
    except ValueError as e:
        raise CorruptCheckpointError(storage.url(manifest_rel), f"invalid JSON ({e})") from None
    old_sha = hashlib.sha256(data).hexdigest()
    if not isinstance(manifest, dict) or manifest.get("sha256") != old_sha:
        raise CorruptCheckpointError(source, f"sha256 does not match its manifest {storage.url(manifest_rel)}: "
                                             "not converted")
    if is_checkpoint_format(data):
        return "already"
    try:
        state = _restricted_load(data, source, "cpu")
    except UnsafeCheckpointError:
        if not trust:
            raise
        log.warning("%s: unpickling with torch.load(weights_only=False) as asked (--trust)", source)
        state = torch.load(io.BytesIO(data), weights_only=False, map_location="cpu")
    converted = encode_checkpoint(state)
    decode_checkpoint(converted, source=source)  # it reads back before anything is replaced
    sha = hashlib.sha256(converted).hexdigest()
    manifest.update(sha256=sha, size=len(converted), format=MANIFEST_FORMAT,
                    converted_from={"sha256": old_sha, "size": len(data),
                                    "at": datetime.now(timezone.utc).isoformat()})
    # Data first, manifest last (as the run store writes them): an interruption in between
    # leaves a manifest that does not match, so the checkpoint is refused, never misread.
    storage.write_bytes(data_rel, converted)
    storage.write_bytes(manifest_rel, json_record_bytes(manifest))
    log.info("%s: converted to %s (sha256 %s... -> %s...)", source, MANIFEST_FORMAT, old_sha[:12], sha[:12])
    return "converted"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m nip_core.trainers.checkpoint_legacy",
        description="Rewrite pickled nipflow checkpoints (<name>.pt with its <name>.json manifest) as "
                    "safetensors + JSON. Unpickling runs any code a pickle holds: convert only files you trust, "
                    "while no process is driving their run.")
    parser.add_argument("paths", nargs="+", metavar="PATH", help="checkpoint files (local paths or URLs)")
    parser.add_argument("--trust", action="store_true", required=True,
                        help="required: you trust these files (they are unpickled with weights_only=False)")
    args = parser.parse_args(argv)
    failed = 0
    for path in args.paths:
        try:
            outcome = convert_pickled_checkpoint(path, trust=args.trust)
        except (CorruptCheckpointError, ValueError, OSError) as e:
            print(f"{path}: {e}", file=sys.stderr)
            failed += 1
            continue
        print(f"{path}: {'converted' if outcome == 'converted' else 'already in the safetensors format'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

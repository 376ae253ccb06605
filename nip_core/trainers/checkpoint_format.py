"""The checkpoint file format: safetensors for the tensors, JSON for everything else.

Loading a checkpoint must never run code stored in it: an attacker who can write to the
run store (e.g. the bucket) can also write a matching sha256 manifest, so the manifest
only detects corruption, not tampering. ``torch.load(weights_only=False)`` unpickles
arbitrary objects, so checkpoints are not pickles any more.

The file (``checkpoints/<name>.pt``, the run store's name for it, and ``warm_start/<name>.pt``)
is a `safetensors <https://huggingface.co/docs/safetensors>`_ file:

* every tensor of the state is a safetensors tensor, named by its place in the state
  (``agents/policy_body.prover.gnn.input_layer.weight``, ``optimizer/state/0/exp_avg``,
  ``rng/torch`` ...), always written from the CPU (a checkpoint does not depend on the
  device that wrote it);
* the header's ``__metadata__`` holds one entry, ``nipflow-checkpoint``: the JSON object
  ``{"version": 1, "state": ...}``, the whole state, where each tensor is a reference
  ``{"tensor": name}`` (one entry, since safetensors writes its metadata map in no fixed
  order: equal states give equal bytes).

The JSON is a tagged tree that keeps the Python types the trainers' ``load_state_dict``
methods get back exactly: plain JSON values and lists stand for themselves; every JSON object
is one tag: ``{"dict": [[key, value], ...]}`` (keys of any JSON-able type, order kept),
``{"odict": [...], "metadata": ...}`` (an ``OrderedDict`` with a module ``_metadata``),
``{"tuple": [...]}``, ``{"float": "nan"|"inf"|"-inf"}``, ``{"tensor": name}``,
``{"ndarray": {"dtype", "shape", "data"}}`` and ``{"np_scalar": ...}`` (numeric numpy
values, e.g. numpy's RNG state), ``{"size": [...]}``, ``{"device": "cpu"}``,
``{"torch_dtype": "float32"}`` and ``{"tensordict": {"batch_size", "device", "names",
"items"}}`` (a plain ``TensorDict`` of tensors and nested ``TensorDict`` s). Decoding
builds only these types; anything else is refused. Writing a state that holds any other
type raises ``TypeError`` naming where it is, so nothing is ever dropped silently.

Pickled checkpoints of earlier nipflow versions are read by
:mod:`nip_core.trainers.checkpoint_legacy` (``torch.load(weights_only=True)`` with a small
allowlist, or refused with the command that converts a trusted file).
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from typing import Any, Mapping

import numpy as np
import torch

from nip_core.errors import CorruptCheckpointError, NipflowError


FORMAT = "nipflow-checkpoint"
VERSION = 1
#: ``format`` of the manifest of a checkpoint in this format (informative: loaders read the bytes)
MANIFEST_FORMAT = f"safetensors+json/{VERSION}"
#: safetensors refuses headers above 100 MB; a larger prefix is no checkpoint of ours
_MAX_HEADER = 100_000_000
_NUMPY_KINDS = "biuf"  # bool, signed, unsigned, float: the numpy values a checkpoint may hold


class UnsafeCheckpointError(CorruptCheckpointError):
    """A checkpoint that could run code when loaded (a pickle outside the allowlist): refused."""

    def __init__(self, path: str, reason: str):
        self.path = path
        self.reason = reason
        NipflowError.__init__(self, f"refusing to load checkpoint {path}: {reason}")


# -- writing ----------------------------------------------------------------------------------


def _join(path: str, key: Any) -> str:
    return f"{path}/{key}" if path else str(key)


class _Encoder:
    """Turns a state into (JSON tree, tensors by name)."""

    def __init__(self):
        self.tensors: dict[str, torch.Tensor] = {}
        self._names: dict[int, str] = {}  # id(tensor) -> name: a tensor held twice is stored once

    def tensor(self, value: torch.Tensor, path: str) -> dict[str, Any]:
        if value.is_sparse or value.layout != torch.strided or value.is_quantized:
            raise TypeError(f"checkpoint state at {path or '/'}: a {value.layout} tensor cannot be stored")
        name = self._names.get(id(value))
        if name is None:
            name, n = path or "tensor", 1
            while name in self.tensors:
                n += 1
                name = f"{path}#{n}"
            self.tensors[name] = value.detach().to("cpu", copy=True).contiguous()
            self._names[id(value)] = name
        node: dict[str, Any] = {"tensor": name}
        if type(value) is torch.nn.Parameter:
            node["requires_grad"] = value.requires_grad
        return node

    def encode(self, value: Any, path: str) -> Any:
        kind = type(value)
        if value is None or kind in (bool, int, str):
            return value
        if kind is float:
            return value if math.isfinite(value) else {"float": repr(value)}
        if kind is list:
            return [self.encode(v, _join(path, i)) for i, v in enumerate(value)]
        if kind is tuple:
            return {"tuple": [self.encode(v, _join(path, i)) for i, v in enumerate(value)]}
        if kind is dict or kind is OrderedDict:
            pairs = [[self.encode(k, _join(path, "<key>")), self.encode(v, _join(path, k))] for k, v in value.items()]
            if kind is dict:
                return {"dict": pairs}
            node = {"odict": pairs}
            if getattr(value, "_metadata", None) is not None:  # module versions (Module.state_dict)
                node["metadata"] = self.encode(value._metadata, _join(path, "<metadata>"))
            return node
        if kind is torch.Tensor or kind is torch.nn.Parameter:
            return self.tensor(value, path)
        if kind is np.ndarray and value.dtype.kind in _NUMPY_KINDS:
            return {"ndarray": {"dtype": value.dtype.str, "shape": list(value.shape),
                                "data": [self.encode(v, path) for v in value.ravel().tolist()]}}
        if isinstance(value, np.generic) and value.dtype.kind in _NUMPY_KINDS:
            return {"np_scalar": {"dtype": value.dtype.str, "value": self.encode(value.item(), path)}}
        if kind is torch.Size:
            return {"size": list(value)}
        if kind is torch.device:
            return {"device": str(value)}
        if kind is torch.dtype:
            return {"torch_dtype": str(value).removeprefix("torch.")}
        from tensordict import TensorDict

        if kind is TensorDict:
            names = list(value.names)
            return {"tensordict": {
                "batch_size": list(value.batch_size),
                "device": None if value.device is None else str(value.device),
                "names": names if any(n is not None for n in names) else None,
                "items": [[k, self.encode(v, _join(path, k))] for k, v in value.items()]}}
        raise TypeError(f"checkpoint state at {path or '/'}: a {kind.__module__}.{kind.__qualname__} cannot be "
                        "stored (checkpoints hold tensors, numbers, strings, lists, tuples, dicts, numeric numpy "
                        "arrays and TensorDicts only)")


def encode_checkpoint(state: Mapping[str, Any]) -> bytes:
    """The bytes of a checkpoint holding ``state`` (see the module docstring).

    Equal states give equal bytes.

    Raises
    ------
    TypeError
        If ``state`` holds a value of another type (names where).
    """
    import safetensors.torch

    encoder = _Encoder()
    tree = encoder.encode(state, "")
    text = json.dumps(tree, separators=(",", ":"), allow_nan=False)
    # One metadata entry: safetensors writes its metadata map in no fixed order.
    return safetensors.torch.save(encoder.tensors, metadata={FORMAT: f'{{"version":{VERSION},"state":{text}}}'})


# -- reading ----------------------------------------------------------------------------------


def _header(data: bytes) -> dict[str, Any] | None:
    """The safetensors header of ``data``, or None when ``data`` is not a safetensors file."""
    if len(data) < 10:
        return None
    size = int.from_bytes(data[:8], "little")
    if size > min(len(data) - 8, _MAX_HEADER) or data[8:9] != b"{":
        return None
    try:
        header = json.loads(data[8:8 + size])
    except (ValueError, UnicodeDecodeError):
        return None
    return header if isinstance(header, dict) else None


def _payload(data: bytes) -> str | None:
    """The ``nipflow-checkpoint`` metadata entry of ``data`` (None: not this format)."""
    header = _header(data)
    metadata = header.get("__metadata__") if header else None
    payload = metadata.get(FORMAT) if isinstance(metadata, dict) else None
    return payload if isinstance(payload, str) else None


def is_checkpoint_format(data: bytes) -> bool:
    """Whether ``data`` is a checkpoint in this format (by its bytes, never by a manifest)."""
    return _payload(data) is not None


class _Decoder:
    def __init__(self, tensors: dict[str, torch.Tensor], map_location):
        self.tensors = tensors
        self.map_location = map_location
        self.used: set[str] = set()

    def decode(self, node: Any) -> Any:
        if node is None or isinstance(node, (bool, int, str)):
            return node
        if isinstance(node, float):
            return node
        if isinstance(node, list):
            return [self.decode(v) for v in node]
        if not isinstance(node, dict):
            raise ValueError(f"unexpected JSON value {type(node).__name__}")
        keys = set(node)
        if keys == {"tuple"}:
            return tuple(self.decode(v) for v in self._list(node["tuple"]))
        if keys == {"dict"}:
            return {self.decode(k): self.decode(v) for k, v in self._pairs(node["dict"])}
        if keys in ({"odict"}, {"odict", "metadata"}):
            result = OrderedDict((self.decode(k), self.decode(v)) for k, v in self._pairs(node["odict"]))
            if "metadata" in node:
                result._metadata = self.decode(node["metadata"])
            return result
        if keys in ({"tensor"}, {"tensor", "requires_grad"}):
            return self._tensor(node)
        if keys == {"float"} and node["float"] in ("nan", "inf", "-inf"):
            return float(node["float"])
        if keys == {"ndarray"}:
            spec = node["ndarray"]
            dtype = self._numpy_dtype(spec["dtype"])
            data = [self.decode(v) for v in self._list(spec["data"])]
            return np.array(data, dtype=dtype).reshape([int(n) for n in self._list(spec["shape"])])
        if keys == {"np_scalar"}:
            spec = node["np_scalar"]
            return self._numpy_dtype(spec["dtype"]).type(self.decode(spec["value"]))
        if keys == {"size"}:
            return torch.Size(int(n) for n in self._list(node["size"]))
        if keys == {"device"}:
            return torch.device(str(node["device"]))
        if keys == {"torch_dtype"}:
            dtypes = {str(d).removeprefix("torch."): d for d in vars(torch).values() if isinstance(d, torch.dtype)}
            if node["torch_dtype"] not in dtypes:
                raise ValueError(f"unknown torch dtype {node['torch_dtype']!r}")
            return dtypes[node["torch_dtype"]]
        if keys == {"tensordict"}:
            return self._tensordict(node["tensordict"])
        raise ValueError(f"unknown tag {sorted(keys)}")

    @staticmethod
    def _list(value: Any) -> list:
        if not isinstance(value, list):
            raise ValueError(f"expected a list, got {type(value).__name__}")
        return value

    def _pairs(self, value: Any) -> list:
        pairs = self._list(value)
        if not all(isinstance(p, list) and len(p) == 2 for p in pairs):
            raise ValueError("expected [key, value] pairs")
        return pairs

    @staticmethod
    def _numpy_dtype(name: Any) -> np.dtype:
        dtype = np.dtype(str(name))
        if dtype.kind not in _NUMPY_KINDS:
            raise ValueError(f"numpy dtype {name!r} is not allowed")
        return dtype

    def _tensor(self, node: dict[str, Any]) -> torch.Tensor:
        name = node["tensor"]
        if not isinstance(name, str) or name not in self.tensors:
            raise ValueError(f"reference to a missing tensor {name!r}")
        self.used.add(name)
        tensor = self.tensors[name]
        if "requires_grad" in node:
            tensor = torch.nn.Parameter(tensor, requires_grad=bool(node["requires_grad"]))
            self.tensors[name] = tensor  # a Parameter referenced twice stays one object
        return tensor

    def _tensordict(self, spec: Any):
        from tensordict import TensorDict

        if not isinstance(spec, dict) or set(spec) != {"batch_size", "device", "names", "items"}:
            raise ValueError("malformed tensordict entry")
        items = {}
        for key, value in self._pairs(spec["items"]):
            value = self.decode(value)
            if not isinstance(key, str) or not isinstance(value, (torch.Tensor, TensorDict)):
                raise ValueError("a tensordict holds tensors and tensordicts under string keys only")
            items[key] = value
        device = spec["device"]
        if device is not None and self.map_location is not None:
            device = self.map_location  # as torch.load(map_location=...) put the tensors there
        td = TensorDict(items, batch_size=[int(n) for n in self._list(spec["batch_size"])], device=device)
        if spec["names"] is not None:
            td.names = [None if n is None else str(n) for n in self._list(spec["names"])]
        return td


def decode_checkpoint(data: bytes, *, source: str, map_location: str | torch.device | None = None) -> Any:
    """The state held by the checkpoint ``data`` (this format only); builds data types only.

    Parameters
    ----------
    data
        The file's bytes.
    source
        The file, named in errors.
    map_location
        The device every tensor is put on (default: the CPU), as ``torch.load`` does.

    Raises
    ------
    CorruptCheckpointError
        If ``data`` is not a checkpoint of this format or does not decode (names ``source``).
    """
    import safetensors.torch

    payload = _payload(data)
    if payload is None:
        raise CorruptCheckpointError(source, f"not a {FORMAT} safetensors file")
    try:
        content = json.loads(payload, parse_constant=_no_constant)
    except ValueError as e:
        raise CorruptCheckpointError(source, f"cannot be decoded (invalid JSON: {e})") from None
    if not isinstance(content, dict) or set(content) != {"version", "state"}:
        raise CorruptCheckpointError(source, "cannot be decoded (no version and state)")
    if content["version"] != VERSION:
        raise CorruptCheckpointError(source, f"{FORMAT} version {content['version']!r}; this nipflow reads "
                                             f"version {VERSION}")
    try:
        tensors = safetensors.torch.load(bytes(data))
        if map_location is not None:
            tensors = {k: v.to(map_location) for k, v in tensors.items()}
        decoder = _Decoder(tensors, map_location)
        state = decoder.decode(content["state"])
    except Exception as e:  # noqa: BLE001 - safetensors, JSON and decoding errors: the file is unusable
        raise CorruptCheckpointError(source, f"cannot be decoded ({type(e).__name__}: {e})") from None
    unused = sorted(set(tensors) - decoder.used)
    if unused:
        raise CorruptCheckpointError(source, f"tensors that the state does not reference: {unused[:5]}")
    return state


def _no_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")

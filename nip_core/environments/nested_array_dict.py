"""``NestedArrayDict``: a small TensorDict-like container of numpy arrays for text rollouts.

Keys are strings or tuples of strings (a nested key ``("agents", "decision")`` is stored
flat as ``"agents.decision"``). Every array shares the leading ``batch_size`` dims.
Text arrays use ``dtype=object`` holding ``str`` or ``None`` ("no message"): numpy's
``StringDType`` would also do, but object arrays pickle and JSON-convert without
surprises and the arrays here are tiny.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

Key = str | tuple[str, ...]


def _flat(key: Key) -> str:
    return ".".join(key) if isinstance(key, tuple) else key


class NestedArrayDict:
    """A dict of numpy arrays with common leading batch dims.

    Parameters
    ----------
    data
        Mapping of (possibly nested tuple) keys to array-likes.
    batch_size
        The common leading shape.

    Raises
    ------
    ValueError
        If an array's leading dims do not match ``batch_size``.
    """

    def __init__(self, data: dict[Key, Any] | None = None, batch_size: Sequence[int] = ()):
        self.batch_size = tuple(int(b) for b in batch_size)
        self._data: dict[str, np.ndarray] = {}
        for key, value in (data or {}).items():
            self[key] = value

    def __setitem__(self, key: Key, value: Any) -> None:
        arr = value if isinstance(value, np.ndarray) else np.asarray(value)
        n = len(self.batch_size)
        if arr.shape[:n] != self.batch_size:
            raise ValueError(f"NestedArrayDict key '{_flat(key)}': shape {arr.shape} does not start "
                             f"with batch size {self.batch_size}")
        self._data[_flat(key)] = arr

    def __getitem__(self, key: Key | int | slice | np.ndarray) -> Any:
        if isinstance(key, (str, tuple)) and (isinstance(key, str) or all(isinstance(k, str) for k in key)):
            try:
                return self._data[_flat(key)]
            except KeyError:
                raise KeyError(f"NestedArrayDict has no key '{_flat(key)}'") from None
        sliced = {k: v[key] for k, v in self._data.items()}
        probe = np.empty(self.batch_size, dtype=np.int8)[key]
        return NestedArrayDict(sliced, probe.shape)

    def __contains__(self, key: Key) -> bool:
        return _flat(key) in self._data

    def keys(self) -> list[str]:
        return list(self._data)

    def items(self) -> Iterator[tuple[str, np.ndarray]]:
        return iter(self._data.items())

    def clone(self) -> "NestedArrayDict":
        return NestedArrayDict({k: v.copy() for k, v in self._data.items()}, self.batch_size)

    def update(self, other: "NestedArrayDict | dict[Key, Any]") -> "NestedArrayDict":
        for k, v in (other.items() if isinstance(other, NestedArrayDict) else other.items()):
            self[k] = v
        return self

    def to_dict(self) -> dict[str, Any]:
        """Plain nested lists (JSON-able; ``None`` stays ``None``)."""
        return {"batch_size": list(self.batch_size), "data": {k: v.tolist() for k, v in self._data.items()}}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "NestedArrayDict":
        out = cls(batch_size=d["batch_size"])
        for k, v in d["data"].items():
            probe = np.asarray(v, dtype=object)
            if probe.size and all(isinstance(x, (bool, np.bool_)) for x in probe.flat):
                out[k] = np.asarray(v, dtype=bool)
            elif probe.size and all(isinstance(x, int) and not isinstance(x, bool) for x in probe.flat):
                out[k] = np.asarray(v, dtype=np.int64)
            elif probe.size and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in probe.flat):
                out[k] = np.asarray(v, dtype=np.float64)
            else:
                arr = np.empty(probe.shape, dtype=object)
                arr[...] = probe
                out[k] = arr
        return out

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, NestedArrayDict) or other.batch_size != self.batch_size:
            return False
        if set(self._data) != set(other._data):
            return False
        return all(np.array_equal(v, other._data[k]) for k, v in self._data.items())

    def __repr__(self) -> str:
        return f"NestedArrayDict(batch_size={self.batch_size}, keys={sorted(self._data)})"


def stack_nested_array_dicts(items: Sequence[NestedArrayDict]) -> NestedArrayDict:
    """Stack along a new leading batch dim (all items must share keys and batch size)."""
    if not items:
        raise ValueError("cannot stack an empty sequence of NestedArrayDicts")
    first = items[0]
    out = NestedArrayDict(batch_size=(len(items), *first.batch_size))
    for key in first.keys():
        arrs = [it[key] for it in items]
        if arrs[0].dtype == object:
            stacked = np.empty((len(items), *arrs[0].shape), dtype=object)
            for i, a in enumerate(arrs):
                stacked[i] = a[()] if a.ndim == 0 else a
        else:
            stacked = np.stack(arrs)
        out[key] = stacked
    return out

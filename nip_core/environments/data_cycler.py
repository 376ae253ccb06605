"""``VariableDataCycler``: an endless, reshuffling stream of dataset indices.

Environments reset a variable number of rows at a time, so they need a loader that can
hand out any number of items per call and carries the remainder of an epoch across
calls. Unlike the original library (which shuffled with the *global* torch generator,
see docs/behaviour.md#b14), the cycler owns a private ``torch.Generator``: the stream of
datapoints depends only on the environment's seed, and its complete state can be saved in
a checkpoint and restored exactly.
"""

from __future__ import annotations

from typing import Any

import torch


class VariableDataCycler:
    """Endless stream of shuffled indices ``0 .. length-1``, one epoch after another.

    Parameters
    ----------
    length
        Number of items in the dataset (must be positive).
    generator
        The generator used for the shuffles; shared with its owner so that one seed
        determines everything the owner draws.
    """

    def __init__(self, length: int, generator: torch.Generator):
        if length <= 0:
            raise ValueError(f"cannot cycle over an empty dataset (length {length})")
        self.length = length
        self.generator = generator
        self._perm = torch.empty(0, dtype=torch.long)
        self._pos = 0

    def next_indices(self, n: int) -> torch.Tensor:
        """The next ``n`` indices (LongTensor ``(n,)``), reshuffling at each epoch end."""
        out: list[torch.Tensor] = []
        needed = n
        while needed > 0:
            if self._pos >= self._perm.numel():
                self._perm = torch.randperm(self.length, generator=self.generator)
                self._pos = 0
            take = min(needed, self._perm.numel() - self._pos)
            out.append(self._perm[self._pos:self._pos + take])
            self._pos += take
            needed -= take
        if not out:
            return torch.empty(0, dtype=torch.long)
        return torch.cat(out)

    def state_dict(self) -> dict[str, Any]:
        return {"perm": self._perm.clone(), "pos": self._pos}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._perm = state["perm"].clone()
        self._pos = int(state["pos"])

"""Which models the server knows, and loading/saving their weights.

Base models are the names of :data:`~nip_core.llm.policy.model.BASE_MODEL_ALIASES`;
fine-tuned models (and checkpoints) are records in the store whose weights
(``models/<job>/<name>.npy``, float16) and learned responses (``.json``) live in the data
directory. Loaded models are kept in a small LRU cache.
"""

from __future__ import annotations

import io
import json
import threading
from collections import OrderedDict
from pathlib import Path

import numpy as np

from nip_core.llm.policy.candidates import Candidate
from nip_core.llm.policy.model import BASE_MODEL_ALIASES, PolicyModel, canonical_base
from nip_core.utils.fileio import atomic_write_bytes as atomic_write
from nip_core.llm.server.records import ModelRecord, now
from nip_core.llm.server.store import Store

# an arbitrary fixed creation time for the base models (2024-07-18)
BASE_CREATED = 1721260800
CACHE_SIZE = 16


class UnknownModelError(KeyError):
    """No base or fine-tuned model has this name."""


class ModelRegistry:
    """Resolve model names to :class:`PolicyModel` objects; save fine-tuned ones."""

    def __init__(self, store: Store, data_dir: Path):
        self.store = store
        self.data_dir = data_dir
        self._cache: OrderedDict[str, PolicyModel] = OrderedDict()
        self._lock = threading.Lock()

    def exists(self, name: str) -> bool:
        return canonical_base(name) is not None or self.store.get_model(name) is not None

    def base_of(self, name: str) -> str:
        """Canonical base model of a model's lineage."""
        canonical = canonical_base(name)
        if canonical is not None:
            return canonical
        record = self.store.get_model(name)
        if record is None:
            raise UnknownModelError(name)
        return record.base

    def get(self, name: str) -> PolicyModel:
        """The model called ``name`` (raises :class:`UnknownModelError`)."""
        with self._lock:
            cached = self._cache.get(name)
            if cached is not None:
                self._cache.move_to_end(name)
                return cached
        if canonical_base(name) is not None:
            model = PolicyModel.base_model(name)
        else:
            record = self.store.get_model(name)
            if record is None:
                raise UnknownModelError(name)
            model = self._load(record)
        with self._lock:
            self._cache[name] = model
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return model

    def _load(self, record: ModelRecord) -> PolicyModel:
        weights = np.load(self.data_dir / record.weights).astype(np.float32)
        weights.flags.writeable = False
        memory = tuple(Candidate(*item) for item in json.loads((self.data_dir / record.memory).read_text()))
        return PolicyModel(name=record.id, base=record.base, weights=weights, memory=memory)

    def save(
        self,
        name: str,
        *,
        job_id: str,
        parent: str,
        weights: np.ndarray,
        memory: tuple[Candidate, ...],
        owned_by: str,
        listed: bool,
        file_stem: str,
    ) -> ModelRecord:
        """Write a model's files atomically and register it (replacing a previous one)."""
        rel_dir = Path("models") / job_id
        weights_rel = rel_dir / f"{file_stem}.npy"
        memory_rel = rel_dir / "memory.json"
        buffer = io.BytesIO()
        np.save(buffer, weights.astype(np.float16))
        atomic_write(self.data_dir / weights_rel, buffer.getvalue())
        memory_bytes = json.dumps([[c.text, c.kind, c.template] for c in memory]).encode("utf-8")
        atomic_write(self.data_dir / memory_rel, memory_bytes)
        record = ModelRecord(
            id=name,
            created=now(),
            owned_by=owned_by,
            job_id=job_id,
            parent=parent,
            base=self.base_of(parent),
            weights=weights_rel.as_posix(),
            memory=memory_rel.as_posix(),
            listed=listed,
        )
        self.store.add_model(record)
        with self._lock:
            self._cache.pop(name, None)
        return record

    def delete(self, name: str) -> bool:
        with self._lock:
            self._cache.pop(name, None)
        return self.store.delete_model(name)

    def list_public(self) -> list[dict]:
        """``model`` objects of the base models and the listed fine-tuned models."""
        out = [{"id": name, "object": "model", "created": BASE_CREATED, "owned_by": "system"} for name in BASE_MODEL_ALIASES]
        out.extend(record.public() for record in self.store.list_models())
        return out

    def public(self, name: str) -> dict:
        if canonical_base(name) is not None:
            return {"id": name, "object": "model", "created": BASE_CREATED, "owned_by": "system"}
        record = self.store.get_model(name)
        if record is None:
            raise UnknownModelError(name)
        return record.public()

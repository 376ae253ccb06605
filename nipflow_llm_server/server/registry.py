"""Which models the server knows, and loading/saving their weights.

Base models are those of the server's engine (:meth:`Engine.base_models`); fine-tuned
models (and checkpoints) are records in the store whose files (written by the engine's
:meth:`~nipflow_llm_server.engines.base.Engine.save_artifact` under ``models/<job>/``) live in
the data directory. A record remembers the engine that made it: a data directory reopened
with another ``--engine`` does not serve (or list) models it cannot load. Loaded models are
kept in a small LRU cache (its size is the engine's).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from nipflow_llm_server.engines.base import Engine
from nipflow_llm_server.server.records import ModelRecord, now
from nipflow_llm_server.server.store import Store

# an arbitrary fixed creation time for the base models (2024-07-18)
BASE_CREATED = 1721260800


class UnknownModelError(KeyError):
    """No base or fine-tuned model has this name."""


class ModelRegistry:
    """Resolve model names to the engine's loaded models; save fine-tuned ones."""

    def __init__(self, store: Store, data_dir: Path, engine: Engine | None = None):
        self.store = store
        self.data_dir = data_dir
        if engine is None:  # the default engine, as before engines existed
            from nipflow_llm_server.engines.selection import SelectionEngine

            engine = SelectionEngine()
        self.engine = engine
        self._cache: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()
        self._loading: dict[str, threading.Lock] = {}  # one per model name: a model loads once at a time

    def _record(self, name: str) -> ModelRecord | None:
        record = self.store.get_model(name)
        return record if record is not None and record.engine == self.engine.name else None

    def exists(self, name: str) -> bool:
        return self.engine.canonical_base(name) is not None or self._record(name) is not None

    def base_of(self, name: str) -> str:
        """Canonical base model of a model's lineage."""
        canonical = self.engine.canonical_base(name)
        if canonical is not None:
            return canonical
        record = self._record(name)
        if record is None:
            raise UnknownModelError(name)
        return record.base

    def get(self, name: str) -> Any:
        """The loaded model called ``name`` (raises :class:`UnknownModelError`).

        Concurrent first requests for one model (a run's rollouts arrive together) load it
        once: the others wait for that load and get its model.
        """
        with self._lock:
            cached = self._cached(name)
            if cached is not None:
                return cached
            loading = self._loading.setdefault(name, threading.Lock())
        with loading:
            with self._lock:
                cached = self._cached(name)  # loaded by the thread this one waited for
            if cached is not None:
                return cached
            if self.engine.canonical_base(name) is not None:
                model = self.engine.load_base(name)
            else:
                record = self._record(name)
                if record is None:
                    raise UnknownModelError(name)
                model = self.engine.load(record.id, record.base, self.data_dir, record.weights, record.memory)
            with self._lock:
                self._cache[name] = model
                while len(self._cache) > self.engine.cache_size:
                    self._cache.popitem(last=False)
        return model

    def _cached(self, name: str) -> Any:
        """The cached model called ``name`` (made most recently used), or None; under ``_lock``."""
        cached = self._cache.get(name)
        if cached is not None:
            self._cache.move_to_end(name)
        return cached

    def save(
        self,
        name: str,
        *,
        job_id: str,
        parent: str,
        artifact: Any,
        owned_by: str,
        listed: bool,
        file_stem: str,
    ) -> ModelRecord:
        """Write a model's files atomically and register it (replacing a previous one)."""
        weights_rel, memory_rel = self.engine.save_artifact(artifact, self.data_dir, Path("models") / job_id, file_stem)
        record = ModelRecord(
            id=name,
            created=now(),
            owned_by=owned_by,
            job_id=job_id,
            parent=parent,
            base=self.base_of(parent),
            weights=weights_rel,
            memory=memory_rel,
            listed=listed,
            engine=self.engine.name,
        )
        self.store.add_model(record)
        with self._lock:
            self._cache.pop(name, None)
        return record

    def delete(self, name: str) -> bool:
        with self._lock:
            self._cache.pop(name, None)
        return self.store.delete_model(name)

    def _base_entry(self, name: str) -> dict:
        entry = {"id": name, "object": "model", "created": BASE_CREATED, "owned_by": "system"}
        return self._with_capabilities(entry, self.engine.canonical_base(name))

    def _with_capabilities(self, entry: dict, base: str) -> dict:
        # extra fields next to OpenAI's four; the official client keeps them as model_extra
        entry["capabilities"] = self.engine.capabilities(base)
        entry["engine"] = self.engine.name
        return entry

    def _fine_tuned_entry(self, record: ModelRecord) -> dict:
        return self._with_capabilities(record.public(), record.base)

    def list_public(self) -> list[dict]:
        """``model`` objects of the base models and the listed fine-tuned models."""
        out = [self._base_entry(name) for name in self.engine.base_models()]
        out.extend(self._fine_tuned_entry(r) for r in self.store.list_models() if r.engine == self.engine.name)
        return out

    def public(self, name: str) -> dict:
        if self.engine.canonical_base(name) is not None:
            return self._base_entry(name)
        record = self._record(name)
        if record is None:
            raise UnknownModelError(name)
        return self._fine_tuned_entry(record)

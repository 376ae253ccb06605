"""The transformers engine's batching queue: continuous batching on one generation thread.

A request's rows (one per choice) join the running :class:`~nipflow_llm_server.engines.generation.DecodeBatch`
of their model between two decoding steps, up to ``max_batch`` rows, and the request is
answered as soon as its own rows finish; rows that finish leave the batch at once. So a
multi-turn episode's next request does not wait for a whole batch to end, and a batch does
not shrink to the few requests that happened to arrive together (with batches generated to
the end, the rollouts of an iteration split into groups that took turns, each group decoding
for its longest row). When nothing runs, the first request waits ``window_s`` for others,
so a burst of requests is prefilled together. Models (batch keys) take turns step by step.

A request nobody waits for any more (its future was cancelled: the chat route cancels it
when its client disconnects) leaves at once: its queued rows are never admitted and its
running rows are dropped from the batch before the next step, so a client that timed out
and retried does not have its first attempt decoded to the end beside the second.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nipflow_llm_server.engines.base import Generation
from nipflow_llm_server.engines.generation import DecodeBatch, Row

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Pending:
    key: Any  # requests with the same key share a batch (the same loaded model)
    rows: list[Row]
    open_batch: Callable[[], DecodeBatch]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    results: list[Generation | None] = field(default_factory=list)
    admitted: int = 0  # rows already in a batch
    left: int = 0  # rows not finished

    def __post_init__(self) -> None:
        self.results = [None] * len(self.rows)
        self.left = len(self.rows)


class Batcher:
    """The batching queue (see the module docstring).

    Parameters
    ----------
    window_s
        How long the first request waits for others when nothing is being generated.
    max_batch
        Sequences generated together at most (per model).
    """

    def __init__(self, window_s: float, max_batch: int):
        self.window_s = window_s
        self.max_batch = max_batch
        self.batch_sizes: list[int] = []  # rows of a batch each time rows joined it (tests, logs)
        self.dropped_rows = 0  # rows left unfinished because their request was abandoned
        self._queue: queue.Queue[_Pending | None] = queue.Queue()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="generation", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout)
            self._thread = None

    async def submit(self, key: Any, rows: list[Row], open_batch: Callable[[], DecodeBatch]) -> list[Generation]:
        """Generate ``rows`` in the running batch of ``key`` (``open_batch`` makes one when
        none runs; called on the generation thread); returns this request's generations."""
        self.start()
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._queue.put(_Pending(key, rows, open_batch, loop, future))
        return await future

    def _take(self, block: bool) -> tuple[list[_Pending], bool]:
        """Requests queued now (``block``: wait for one, then ``window_s`` for more) and
        whether the queue was told to stop."""
        items: list[_Pending] = []
        deadline = None
        while True:
            try:
                if block and not items:
                    item = self._queue.get()
                    deadline = time.monotonic() + self.window_s
                elif deadline is not None and deadline > time.monotonic():
                    item = self._queue.get(timeout=deadline - time.monotonic())
                else:
                    item = self._queue.get_nowait()
            except queue.Empty:
                return items, False
            if item is None:
                return items, True
            items.append(item)

    def _loop(self) -> None:
        batches: dict[Any, DecodeBatch] = {}
        owners: dict[Any, list[_Pending]] = {}  # requests with rows in each batch
        waiting: list[_Pending] = []
        stopping = False
        while not stopping or batches or waiting:
            if not stopping:
                items, stopping = self._take(block=not batches and not waiting)
                waiting += items
            waiting = [item for item in waiting if not item.future.done()]  # abandoned before joining
            admitted = [item for item in waiting if self._admit(item, batches, owners)]
            if admitted:  # one entry per batch that rows joined in this round
                self.batch_sizes += [len(batches[key]) for key in dict.fromkeys(i.key for i in admitted)
                                     if key in batches]
            waiting = [item for item in waiting if item.admitted < len(item.rows) and not item.future.done()]
            for key in list(batches):
                if self._drop_abandoned(key, batches, owners):
                    self._step(key, batches, owners)
            if stopping and not batches:
                for item in waiting:  # cannot happen unless admission failed; answer them all the same
                    _settle_in(item, None, RuntimeError("the generation queue stopped"))
                return

    def _admit(self, item: _Pending, batches: dict[Any, DecodeBatch], owners: dict[Any, list[_Pending]]) -> bool:
        """Put as many of ``item``'s rows as fit into its model's batch; True when some joined."""
        batch = batches.get(item.key)
        try:
            if batch is None:
                batch = batches[item.key] = item.open_batch()
                owners[item.key] = []
            room = self.max_batch - len(batch)
            if room <= 0 or item.admitted == len(item.rows):
                return False
            take = list(range(item.admitted, min(len(item.rows), item.admitted + room)))
            batch.admit([item.rows[i] for i in take], [(item, i) for i in take])
        except Exception as exc:
            log.exception("prefill failed for a request of %d sequences", len(item.rows))
            item.admitted = len(item.rows)  # nothing more of it is generated
            _settle_in(item, None, exc)
            if batch is not None and not len(batch):
                batches.pop(item.key, None)
                owners.pop(item.key, None)
            return False
        item.admitted = take[-1] + 1
        owners[item.key].append(item)
        return True

    def _drop_abandoned(self, key: Any, batches: dict[Any, DecodeBatch], owners: dict[Any, list[_Pending]]) -> bool:
        """Drop the rows of ``key``'s batch whose request is abandoned; False when none are left.

        Requests already answered leave ``owners`` here too."""
        done = {item for item in owners[key] if item.future.done()}  # one look: futures change meanwhile
        owners[key] = [item for item in owners[key] if item not in done]
        gone = [item for item in done if item.left > 0]
        if gone:
            batch = batches[key]
            dropped = batch.drop(lambda owner: owner[0] in done)
            self.dropped_rows += dropped
            log.warning("%d sequences of %d requests nobody waits for (client disconnected, or the request failed) "
                        "left the batch unfinished; %d still running", dropped, len(gone), len(batch))
            if not len(batch):
                del batches[key]
                owners.pop(key, None)
                return False
        return True

    def _step(self, key: Any, batches: dict[Any, DecodeBatch], owners: dict[Any, list[_Pending]]) -> None:
        batch = batches[key]
        try:
            finished = batch.step()
        except Exception as exc:  # every request in the batch learns of the failure
            log.exception("generation failed for a batch of %d sequences", len(batch))
            for item in dict.fromkeys(owners.pop(key)):
                _settle_in(item, None, exc)
            del batches[key]
            return
        for running in finished:
            item, index = running.owner
            item.results[index] = running.generation(batch.decode)
            item.left -= 1
            if item.left == 0:
                _settle_in(item, item.results, None)
        if not len(batch):
            del batches[key]
            owners.pop(key, None)


def _settle_in(item: _Pending, result: Any, error: BaseException | None) -> None:
    if item.future.done():
        return
    item.loop.call_soon_threadsafe(_settle, item.future, result, error)


def _settle(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if future.done():  # the client went away, or an earlier failure was reported
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)

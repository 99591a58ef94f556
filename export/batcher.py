"""The development server's request batcher (TF Serving's batching, simplified).

:class:`Batcher` owns one queue and one worker thread per signature: requests submitted while
the first one waits (up to ``batch_timeout_ms``) are merged into one call, up to
``max_batch_size`` rows, and each request gets its own rows of the outputs back.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
import time
from collections.abc import Callable

import numpy as np

from aiayn.export.serving_errors import ServingError


@dataclasses.dataclass
class _Task:
    texts: np.ndarray  # object array of bytes, (rows,)
    future: concurrent.futures.Future


class Batcher:
    """Merges concurrent requests into one batch per call of ``fn`` (like TF Serving's batcher).

    Args:
      fn: ``fn(texts: np.ndarray[object] (rows,)) -> dict[str, np.ndarray]`` with outputs whose
        first dimension is ``rows``.
      max_batch_size: the most rows in one merged batch.
      batch_timeout_ms: how long the first request waits for others to join.
    """

    def __init__(self, fn: Callable[[np.ndarray], dict[str, np.ndarray]], max_batch_size: int,
                 batch_timeout_ms: float = 5.0, name: str = "batcher"):
        self.fn = fn
        self.max_batch_size = max_batch_size
        self.timeout = batch_timeout_ms / 1000.0
        self._queue: list[_Task] = []
        self._cv = threading.Condition()
        self._closed = False
        self.batches_run = 0
        self.largest_batch = 0
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, texts: np.ndarray) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._cv:
            if self._closed:
                future.set_exception(ServingError("UNAVAILABLE", "The servable was unloaded."))
                return future
            self._queue.append(_Task(texts, future))
            self._cv.notify()
        return future

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()

    def _take(self) -> list[_Task]:
        with self._cv:
            while not self._queue and not self._closed:
                self._cv.wait()
            if not self._queue:
                return []
            deadline = time.monotonic() + self.timeout
            while not self._closed:
                rows = sum(len(t.texts) for t in self._queue)
                left = deadline - time.monotonic()
                if rows >= self.max_batch_size or left <= 0:
                    break
                self._cv.wait(left)
            batch, rows = [], 0
            while self._queue and rows + len(self._queue[0].texts) <= self.max_batch_size:
                task = self._queue.pop(0)
                batch.append(task)
                rows += len(task.texts)
            if not batch:  # a single over-sized task (callers check sizes; never stall)
                batch.append(self._queue.pop(0))
            return batch

    def _run(self, tasks: list[_Task]) -> None:
        texts = np.concatenate([t.texts for t in tasks])
        try:
            outputs = self.fn(texts)
        except Exception as err:  # noqa: BLE001 - reported per request below
            if len(tasks) > 1:
                # One bad request (e.g. rejected as too long) must not fail its batch-mates.
                for task in tasks:
                    self._run([task])
                return
            tasks[0].future.set_exception(err)
            return
        self.batches_run += 1
        self.largest_batch = max(self.largest_batch, len(texts))
        start = 0
        for task in tasks:
            end = start + len(task.texts)
            task.future.set_result({k: v[start:end] for k, v in outputs.items()})
            start = end

    def _loop(self) -> None:
        while True:
            tasks = self._take()
            if not tasks:
                return
            self._run(tasks)

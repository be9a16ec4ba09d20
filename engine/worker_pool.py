"""Threads that take queued work one item at a time: what Whisper's readings
(engine/whisper_readers.py ReadingWorker) and Piper's renders (engine/runtime/tts_stream.py
RenderWorker) share. Both run native code that releases the GIL (CTranslate2, onnxruntime), so
their threads compute beside the engine's tick on the other cores.

A subclass keeps its own queue order: `_queued` and `_take` run under the pool's lock, `_work`
outside it, on the pool's thread. A failure inside `_work` is its own business (it becomes the
item's result); a failure while handing a result over is logged and the thread goes on.
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from typing import Any, Callable

log = logging.getLogger(__name__)


class WorkerPool(ABC):
    def __init__(self, threads: int, name: str) -> None:
        self.threads = threads
        self._ready = threading.Condition()
        self._closed = False
        self._pool = [threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True) for i in range(threads)]

    def start(self) -> None:
        """Start the threads: a subclass calls it once its queue exists."""
        for thread in self._pool:
            thread.start()

    def _queue_up(self, add: Callable[[], None]) -> None:
        """Queue an item with `add` (under the lock) and wake a thread for it."""
        with self._ready:
            add()
            self._ready.notify()

    def close(self) -> None:
        with self._ready:
            self._closed = True
            self._ready.notify_all()
        for thread in self._pool:
            thread.join(5.0)

    @abstractmethod
    def _queued(self) -> bool:
        """Whether an item waits (called under the lock)."""

    @abstractmethod
    def _take(self) -> Any:
        """The next item off the queue (called under the lock, with one waiting)."""

    @abstractmethod
    def _work(self, item: Any) -> None:
        """Do the item's work and hand its result over (on the pool's thread, outside the lock)."""

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._queued() and not self._closed:
                    self._ready.wait()
                if self._closed:
                    return
                item = self._take()
            self._work(item)


def hand_over(done: Callable[..., None], *result: Any, what: str) -> None:
    """Call a consumer with a result; its bug must not stop the pool's thread for every stream."""
    try:
        done(*result)
    except Exception:  # noqa: BLE001 - logged; the other streams' work goes on
        log.exception("delivering %s failed", what)

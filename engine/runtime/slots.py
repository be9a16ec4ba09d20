"""What every stream on the runtime shares: slots in preallocated state pools, the channel its
events come back on, and the events()/poll() that read it.

A stream is a slot: a row of a StatePool preallocated for max_streams, handed out by a
SlotTable (one per model) and taken back on close or on the stream's own failure. Events
cross from the runtime's threads to the consumer's event loop through an EventQueue, whose
put() never blocks. RuntimeStream is the base of both stream kinds (stt_stream.py,
tts_stream.py); StepReport and Stepper are what each model's part of a tick gives the loop
(loop.py).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Generic, Optional, Protocol, Sequence, TypeVar

import torch
from torch import Tensor

from ..interface import CapacityError, StreamFailed

log = logging.getLogger("engine.runtime")  # one logger for the whole runtime package


# -- state pool and event channel --------------------------------------------------------------

class StatePool:
    """Every stream's model state, preallocated: each state tensor as one [capacity, ...] tensor.

    `template` is a model's state for a batch of one, a list of dataclasses of tensors (e.g.
    list[BlockState]); a stream's state is row `slot` of every tensor. Float states are fp32.
    """

    def __init__(self, template: Sequence[Any], capacity: int) -> None:
        self.capacity = capacity
        self._kinds = [type(layer) for layer in template]
        self.layers = [{f.name: _rows_like(getattr(layer, f.name), capacity) for f in dataclasses.fields(layer)}
                       for layer in template]

    def gather(self, slots: Tensor) -> list[Any]:
        return [kind(**{name: pool.index_select(0, slots) for name, pool in layer.items()})
                for kind, layer in zip(self._kinds, self.layers)]

    def scatter(self, slots: Tensor, state: Sequence[Any]) -> None:
        for layer, new in zip(self.layers, state):
            for name, pool in layer.items():
                pool.index_copy_(0, slots, getattr(new, name).to(pool.dtype))

    def zero(self, slots: Tensor) -> None:
        for layer in self.layers:
            for pool in layer.values():
                pool.index_fill_(0, slots, 0)

    def bytes_per_slot(self) -> int:
        return sum(pool[0].numel() * pool.element_size() for layer in self.layers for pool in layer.values())


def _rows_like(tensor: Tensor, capacity: int) -> Tensor:
    """Half-precision states are kept in fp32; fp64 ones and integers as they are."""
    dtype = torch.float32 if tensor.dtype in (torch.float16, torch.bfloat16) else tensor.dtype
    return torch.zeros(capacity, *tensor.shape[1:], dtype=dtype, device=tensor.device)


class EventQueue:
    """Items from the runtime thread to one consumer, asyncio or not; put() never blocks."""

    def __init__(self) -> None:
        self._items: collections.deque = collections.deque()
        self._lock = threading.Lock()
        self._waiter: Optional[asyncio.Future] = None

    def put(self, item: Any) -> None:
        with self._lock:
            self._items.append(item)
            waiter, self._waiter = self._waiter, None
        if waiter is not None:
            try:
                waiter.get_loop().call_soon_threadsafe(_wake, waiter)
            except RuntimeError:  # the consumer's loop is closed: nobody is listening
                pass

    async def get(self) -> Any:
        while True:
            with self._lock:
                if self._items:
                    return self._items.popleft()
                waiter = self._waiter = asyncio.get_running_loop().create_future()
            await waiter

    def get_nowait(self) -> list[Any]:
        with self._lock:
            items = list(self._items)
            self._items.clear()
        return items


def _wake(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)


_END = object()  # end of a stream's events


# -- streams and their slots ----------------------------------------------------------------------

EventT = TypeVar("EventT")


class RuntimeStream(Generic[EventT]):
    """A stream on the runtime: its slot, whether it is closed (and why: `error`), and the
    channel its events come back on. The SlotTable that opened it closes it (release)."""

    cancelled = False  # set by a stream that can be cancelled (TTS): its events() end at once

    def __init__(self, session_id: str, slot: int) -> None:
        self.session_id, self.slot = session_id, slot
        self.error: Optional[StreamFailed] = None
        self.closed = False
        self.channel = EventQueue()

    async def events(self) -> AsyncIterator[EventT]:
        """Events in stream order until the stream ends; raises StreamFailed if it failed."""
        while True:
            item = await self.channel.get()
            if item is _END or self.cancelled:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def poll(self) -> list[EventT]:
        """The events so far, without waiting (for synchronous callers; see .error)."""
        items = self.channel.get_nowait()
        return [item for item in items if item is not _END and not isinstance(item, BaseException)]


@dataclass
class StepReport:
    """What one model did in one tick."""

    batches: list[int] = field(default_factory=list)  # rows of each batched step, in order
    lags: list[float] = field(default_factory=list)  # per stepped frame, seconds since its audio arrived
    backlog: int = 0  # most model frames any stream still has waiting after the tick
    ttfas: list[float] = field(default_factory=list)  # TTS: seconds from a reply's first text to its first audio
    late_audio_chunks: int = 0  # TTS: chunks that came after their playout time


class Stepper(Protocol):
    """One model's part of every tick (STT, TTS). Called only from the tick."""

    def step(self) -> StepReport: ...

    def busy(self) -> bool:
        """Has open streams: the runtime thread sleeps while no stepper is busy."""

    def free_slots(self) -> int: ...

    def warm_up(self) -> None: ...

    def close_all(self) -> None: ...


class SlotTable:
    """The slots of one model's state pool: handed out to streams, taken back on close or on a
    stream's failure. Shared by both steppers; the streams are RuntimeStreams."""

    kind = ""  # "STT", "TTS": for messages

    def __init__(self, max_streams: int) -> None:
        self.max_streams = max_streams
        self.failed = 0
        self._streams: dict[int, Any] = {}
        # A freed slot is reusable at once, even mid-tick: its new stream is zeroed at the start
        # of its first tick, after whatever the tick in flight writes to the old row.
        self._free = list(range(max_streams - 1, -1, -1))  # pop() hands out slot 0 first
        self._lock = threading.Lock()

    def _open(self, make: Callable[[int], Any]) -> Any:
        with self._lock:
            if not self._free:
                raise CapacityError(f"all {self.max_streams} {self.kind} slots are in use")
            stream = make(self._free.pop())
            self._streams[stream.slot] = stream
        return stream

    def release(self, stream: Any, error: Optional[BaseException] = None) -> None:
        """Close a stream (with `error`: failed) and free its slot; idempotent, from any thread."""
        with self._lock:
            if stream.closed:
                return
            stream.closed = True
            del self._streams[stream.slot]
            self._free.append(stream.slot)
            if error is not None:
                self.failed += 1
                stream.error = StreamFailed(f"{self.kind} stream {stream.session_id!r} failed: {error!r}")
                stream.error.__cause__ = error
        if error is not None:
            log.warning("%s stream %s failed: %r", self.kind, stream.session_id, error)
        stream.channel.put(stream.error or _END)

    def streams(self) -> list:
        with self._lock:
            return list(self._streams.values())

    def busy(self) -> bool:
        return bool(self._streams)

    def open_streams(self) -> int:
        return len(self._streams)

    def free_slots(self) -> int:
        return len(self._free)

    def close_all(self) -> None:
        for stream in self.streams():
            self.release(stream)

"""The speech engine in a process of its own: interface.Engine over a socket.

The gateway's event loop paces every call's audio and needs a little CPU every 20 ms, on time.
In one process with the engine it also needs the GIL, which the engine's threads (the tick,
Whisper's readings, the voice's renders) hold between their native calls, and they run at a
lower priority (engine/priority.py): one can hold the GIL while waiting for a CPU. Here the
engine runs in a child process and the two share no GIL; a frame of audio costs the loop one
pickled message, and frames leave together every FLUSH_EVERY_S, so the engine hears a frame
up to 20 ms later (a reply's text, an utterance's end, a new stream leave at once). On a 2-core
VM its soaks had no loop stall over 50 ms where the engine inside the gateway had some, and its
replies come as soon (docs/benchmarks.md): the gateway runs it so by default (config
engine_process). What it gives wherever it runs:
a crash in the engine (a native library's, say) fails its streams and a new engine starts,
while the node itself (signaling, sessions, SIP) goes on.

    engine = EngineProcess(dict(stt_model="whisper-tiny.en", with_tts=True))
    await engine.launch()                 # spawns `python -m engine.process`, waits for its warm-up
    stream = engine.open_stt("session")   # the same streams as SpeechEngine's
    await engine.aclose()

If the child dies, every open stream fails (StreamFailed from events()), admission says no,
and a new child is started and warmed up (`restarts` counts them).

Wire: each message is a 4-byte big-endian length and a pickle, over a socketpair that only
the two processes hold. Parent to child: ("stt", id, session), ("tts", id, session, voice),
("push", id, pcm), ("flush", id), ("text", id, delta), ("end", id), ("close", id). Child to
parent: ("ready", info, EngineStats, admission), ("stats", EngineStats, admission), ("event", id, event),
("ended", id), ("failed", id, message), ("log", level, logger, message), ("error", exception).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import pickle
import socket
import sys
import threading
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Optional

import numpy as np

from .interface import CapacityError, EngineStats, StreamFailed
from .models import DEFAULT_VOICE, check_voice
from .priority import ENGINE_NICE

log = logging.getLogger("engine.process")

STATS_EVERY_S = 0.1  # the child's figures and admission answer, as often as this
FLUSH_EVERY_S = 0.02  # messages to the other process leave at most this late (one frame of audio)
RESTART_DELAYS_S = (1.0, 5.0, 30.0)  # waits before each new child after a death; the last repeats
STOP_TIMEOUT_S = 10.0  # a child that has not exited this long after its socket closed is killed
_HEADER = 4
_END = object()  # a stream's events are over


def _frame(message: Any) -> bytes:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return len(payload).to_bytes(_HEADER, "big") + payload


class _Wire(asyncio.Protocol):
    """Whole messages out of the byte stream."""

    def __init__(self, on_message: Callable[[Any], None], on_lost: Callable[[], None]) -> None:
        self._on_message, self._on_lost = on_message, on_lost
        self._buffer = bytearray()
        self._outbox: list[bytes] = []  # messages waiting for the next write
        self._timer: Optional[asyncio.TimerHandle] = None  # that write, when only batched ones wait
        self.transport: Optional[asyncio.Transport] = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        start = 0
        while len(self._buffer) - start >= _HEADER:
            size = int.from_bytes(self._buffer[start:start + _HEADER], "big")
            end = start + _HEADER + size
            if len(self._buffer) < end:
                break
            message = pickle.loads(self._buffer[start + _HEADER:end])
            start = end
            self._on_message(message)
        del self._buffer[:start]

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self._on_lost()

    def send(self, message: Any, batch: bool = False) -> None:
        """Send a message, with every one queued before it. A `batch` one (a frame of audio)
        waits instead, up to FLUSH_EVERY_S, and what that time gathers leaves in one write: the
        other process wakes once for every call's frames of that time, not once per frame (400
        times a second with 8 calls up). The rest (a reply's text, the end of an utterance,
        a stream opened) carry a reply's latency and leave at once."""
        if self.transport is None or self.transport.is_closing():
            return
        self._outbox.append(_frame(message))
        if not batch:
            self._flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(FLUSH_EVERY_S, self._flush)

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        frames, self._outbox = self._outbox, []
        if frames and self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(frames))


# -- the gateway's side ----------------------------------------------------------------------

class _RemoteStream:
    """One stream in the child: what the gateway calls is sent, what comes back is queued."""

    def __init__(self, engine: "EngineProcess", stream_id: int, kind: str) -> None:
        self._engine, self.id, self.kind = engine, stream_id, kind
        self._queue: asyncio.Queue = asyncio.Queue()
        self.closed = False
        self._over = False  # events() has ended: later calls end at once

    async def events(self) -> AsyncIterator[Any]:
        """Events in stream order until the stream ends; raises StreamFailed if it failed."""
        while not self._over:
            item = await self._queue.get()
            if item is _END:
                self._over = True
                return
            if isinstance(item, BaseException):
                self._over = True
                raise item
            yield item

    def close(self) -> None:
        if not self.closed:
            self._engine._send(("close", self.id))
            self._finish(_END)

    def _deliver(self, item: Any) -> None:
        if not self.closed:
            self._queue.put_nowait(item)

    def _finish(self, item: Any) -> None:
        """Local end (close, failure, the child's end): the slot is free, events() ends with `item`."""
        if not self.closed:
            self._queue.put_nowait(item)
            self.closed = True
            self._engine._forget(self)


class RemoteSttStream(_RemoteStream):
    def push(self, pcm16k: np.ndarray) -> None:
        """As RuntimeSttStream.push: NaN/inf audio fails the stream (ValueError here,
        StreamFailed from events()); pushes after close are ignored."""
        if self.closed:
            return
        pcm16k = np.asarray(pcm16k)
        if pcm16k.dtype.kind == "f" and not np.isfinite(pcm16k).all():
            error = ValueError("audio contains NaN or infinite samples")
            failure = StreamFailed(f"STT stream failed: {error!r}")
            failure.__cause__ = error
            self._engine._send(("close", self.id))
            self._finish(failure)
            raise error
        self._engine._send(("push", self.id, pcm16k), batch=True)

    def flush(self) -> None:
        if not self.closed:
            self._engine._send(("flush", self.id))


class RemoteTtsStream(_RemoteStream):
    def push_text(self, delta: str) -> None:
        if not isinstance(delta, str):
            raise TypeError(f"text delta must be str, not {type(delta).__name__}")
        if not self.closed:
            self._engine._send(("text", self.id, delta))

    def end(self) -> None:
        if not self.closed:
            self._engine._send(("end", self.id))

    def cancel(self) -> None:
        """Stop now: no further events, the slot is freed at once."""
        self.close()


class EngineProcess:
    """interface.Engine over a child process that runs a SpeechEngine (see the module's doc)."""

    def __init__(self, options: dict[str, Any]) -> None:
        """`options`: SpeechEngine's keyword arguments, JSON-serializable (paths as strings);
        `stt_model` a name."""
        self.options = dict(options)
        self.restarts = 0
        self._process: Optional[asyncio.subprocess.Process] = None
        self._wire: Optional[_Wire] = None
        self._streams: dict[int, _RemoteStream] = {}
        self._next_id = 0
        self._info: dict[str, Any] = {}
        self._stats: Optional[EngineStats] = None
        self._admission: tuple[bool, float] = (False, 1.0)
        self._ready = False
        self._closing = False
        self._started: Optional[asyncio.Future] = None
        self._supervisor: Optional[asyncio.Task] = None

    # -- lifecycle --

    async def launch(self) -> None:
        """Start the child and wait for its engine to warm up; raises what its start-up raised
        (RuntimeError when it died without a word)."""
        await self._spawn()
        self._supervisor = asyncio.ensure_future(self._supervise())

    def start(self) -> None:
        raise RuntimeError("EngineProcess starts with `await launch()`")

    async def _spawn(self) -> None:
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair()
        self._started = loop.create_future()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(Path(__file__).resolve().parent.parent), *filter(None, [os.environ.get("PYTHONPATH")])]))
        try:
            self._process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "engine.process", str(theirs.fileno()), json.dumps(self.options),
                pass_fds=[theirs.fileno()], env=env, stdin=asyncio.subprocess.DEVNULL)
        finally:
            theirs.close()
        wire = self._wire = _Wire(self._on_message, lambda: self._on_lost(wire))
        await loop.create_unix_connection(lambda: wire, sock=ours)
        await self._started

    async def _supervise(self) -> None:
        """A child that dies is replaced: its streams fail, then a new one warms up."""
        while True:
            code = await self._process.wait()
            if self._closing:
                return
            self._ready = False
            log.error("engine process exited (code %s): its streams fail, a new one starts", code)
            self._fail_all(f"the engine process exited (code {code})")
            for attempt, delay in enumerate(_delays()):
                await asyncio.sleep(delay)
                if self._closing:
                    return
                try:
                    await self._spawn()
                    break
                except Exception:
                    log.exception("engine process restart %d failed", attempt + 1)

    async def aclose(self) -> None:
        """Stop the child: its streams end, it closes its engine and exits (killed if it hangs)."""
        self._closing = True
        self._ready = False
        for stream in list(self._streams.values()):
            stream._finish(_END)
        if self._wire is not None and self._wire.transport is not None:
            self._wire.transport.close()
        if self._process is not None and self._process.returncode is None:
            try:
                await asyncio.wait_for(self._process.wait(), STOP_TIMEOUT_S)
            except asyncio.TimeoutError:
                log.warning("engine process did not exit: killed")
                self._process.kill()
                await self._process.wait()
        if self._supervisor is not None:
            self._supervisor.cancel()

    def close(self) -> None:
        raise RuntimeError("EngineProcess stops with `await aclose()`")

    # -- interface.Engine --

    @property
    def ready(self) -> bool:
        return self._ready

    @property
    def device(self) -> str:
        return self._info.get("device", "")

    @property
    def pid(self) -> Optional[int]:
        return self._process.pid if self._process is not None else None

    def admission(self) -> tuple[bool, float]:
        """The child's last answer (at most STATS_EVERY_S old), and no while no slot is free
        here (a call opens its streams before the child's next answer)."""
        retry_after_s = self._admission[1] or 1.0
        if not self._ready:
            return False, retry_after_s
        if self._open("stt") >= self._info["max_stt"] or self._open("tts") >= self._info.get("max_tts", 1):
            return False, retry_after_s
        return self._admission

    def open_stt(self, session_id: str) -> RemoteSttStream:
        return self._new(RemoteSttStream, "stt", session_id)

    def open_tts(self, session_id: str, voice: str = DEFAULT_VOICE) -> RemoteTtsStream:
        check_voice(voice)
        if not self._info.get("max_tts"):
            raise RuntimeError("this engine was built without text-to-speech")
        return self._new(RemoteTtsStream, "tts", session_id, voice)

    def stats(self) -> Optional[EngineStats]:
        """The child's figures, at most STATS_EVERY_S old (None before its first start)."""
        return self._stats

    # -- streams --

    def _new(self, kind_class: type, kind: str, session_id: str, *extra: Any) -> Any:
        if not self._ready:
            raise CapacityError("the engine process is not ready")
        limit = self._info["max_stt" if kind == "stt" else "max_tts"]
        if self._open(kind) >= limit:
            raise CapacityError(f"all {limit} {kind.upper()} slots are in use")
        self._next_id += 1
        stream = kind_class(self, self._next_id, kind)
        self._streams[stream.id] = stream
        self._send((kind, stream.id, session_id, *extra))
        return stream

    def _open(self, kind: str) -> int:
        return sum(stream.kind == kind for stream in self._streams.values())

    def _forget(self, stream: _RemoteStream) -> None:
        self._streams.pop(stream.id, None)

    def _fail_all(self, reason: str) -> None:
        for stream in list(self._streams.values()):
            stream._finish(StreamFailed(f"{stream.kind.upper()} stream failed: {reason}"))

    def _send(self, message: Any, batch: bool = False) -> None:
        if self._wire is not None:
            self._wire.send(message, batch)

    def _on_lost(self, wire: _Wire) -> None:
        if wire is not self._wire:
            return  # an earlier child's socket
        self._ready = False
        self._fail_all("the engine process closed its socket")
        if self._started is not None and not self._started.done():
            self._started.set_exception(RuntimeError("the engine process exited before it was ready "
                                                     "(its log says why)"))

    def _on_message(self, message: Any) -> None:
        kind = message[0]
        if kind == "event":
            stream = self._streams.get(message[1])
            if stream is not None:
                stream._deliver(message[2])
        elif kind == "stats":
            self._stats, self._admission = message[1], message[2]
        elif kind == "ended":
            stream = self._streams.get(message[1])
            if stream is not None:
                stream._finish(_END)
        elif kind == "failed":
            stream = self._streams.get(message[1])
            if stream is not None:
                stream._finish(StreamFailed(message[2]))
        elif kind == "log":
            logging.getLogger(message[2]).log(message[1], "%s", message[3])
        elif kind == "ready":
            if self._info:  # (a child before this one was ready: this is a restart)
                self.restarts += 1
            self._info = message[1]
            self._stats, self._admission = message[2], message[3]
            self._ready = True
            if not self._started.done():
                self._started.set_result(None)
        elif kind == "error" and not self._started.done():
            self._started.set_exception(message[1])


def _delays() -> Any:
    yield from RESTART_DELAYS_S
    while True:
        yield RESTART_DELAYS_S[-1]


# -- the child's side ------------------------------------------------------------------------

class _Sender:
    """Messages to the gateway from any of the child's threads: written by its event loop once
    that runs, straight to the (blocking) socket before."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._lock = threading.Lock()
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._writer: Optional[asyncio.StreamWriter] = None

    def attach(self, loop: asyncio.AbstractEventLoop, writer: asyncio.StreamWriter) -> None:
        with self._lock:
            self._loop, self._writer = loop, writer

    def send(self, message: Any) -> None:
        frame = _frame(message)
        with self._lock:
            loop, writer = self._loop, self._writer
            if loop is None:
                self._sock.sendall(frame)
                return
        try:
            if threading.current_thread() is threading.main_thread():
                writer.write(frame)
            else:
                loop.call_soon_threadsafe(writer.write, frame)
        except RuntimeError:  # the loop has closed: the gateway has gone
            pass


class _LogToGateway(logging.Handler):
    """The child's log records go out through the gateway's logging (its format, its level)."""

    def __init__(self, sender: _Sender) -> None:
        super().__init__()
        self._sender = sender

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
            if record.exc_info:
                message += "\n" + logging.Formatter().formatException(record.exc_info)
            self._sender.send(("log", record.levelno, record.name, message))
        except Exception:
            self.handleError(record)


def _build(options: dict[str, Any]) -> Any:
    from .runtime import SpeechEngine

    options = dict(options)
    for key in ("weights_path", "tts_weights_path"):
        if options.get(key):
            options[key] = Path(options[key])
    engine = SpeechEngine(options.pop("stt_model", None), **options)
    engine.start()
    return engine


async def _serve(engine: Any, sock: socket.socket, sender: _Sender) -> None:
    reader, writer = await asyncio.open_unix_connection(sock=sock)
    sender.attach(asyncio.get_running_loop(), writer)
    runtime = engine.runtime
    info = {"device": engine.device, "max_stt": runtime.stt.max_streams,
            "max_tts": runtime.tts.max_streams if runtime.tts is not None else 0}
    sender.send(("ready", info, engine.stats(), engine.admission()))
    streams: dict[int, Any] = {}
    pumps: set[asyncio.Task] = set()

    async def pump(stream_id: int, stream: Any) -> None:
        try:
            async for event in stream.events():
                sender.send(("event", stream_id, event))
            sender.send(("ended", stream_id))
        except StreamFailed as exc:
            sender.send(("failed", stream_id, str(exc)))
        finally:
            streams.pop(stream_id, None)

    def open_stream(stream_id: int, opener: Callable[[], Any]) -> None:
        try:
            stream = opener()
        except Exception as exc:  # CapacityError, a bad voice: this stream fails, nothing else
            sender.send(("failed", stream_id, f"{type(exc).__name__}: {exc}"))
            return
        streams[stream_id] = stream
        task = asyncio.ensure_future(pump(stream_id, stream))
        pumps.add(task)
        task.add_done_callback(pumps.discard)

    async def report() -> None:
        while True:
            await asyncio.sleep(STATS_EVERY_S)
            sender.send(("stats", engine.stats(), engine.admission()))

    reporter = asyncio.ensure_future(report())
    try:
        while True:
            try:
                size = int.from_bytes(await reader.readexactly(_HEADER), "big")
                message = pickle.loads(await reader.readexactly(size))
            except (asyncio.IncompleteReadError, ConnectionError):
                return  # the gateway closed the socket (or died): stop
            kind, stream_id = message[0], message[1]
            if kind == "stt":
                open_stream(stream_id, lambda: engine.open_stt(message[2]))
            elif kind == "tts":
                open_stream(stream_id, lambda: engine.open_tts(message[2], message[3]))
            elif (stream := streams.get(stream_id)) is not None:
                _apply(stream, kind, message)
    finally:
        reporter.cancel()
        for stream in list(streams.values()):
            stream.close()
        await asyncio.to_thread(engine.close)


def _apply(stream: Any, kind: str, message: tuple) -> None:
    try:
        if kind == "push":
            stream.push(message[2])
        elif kind == "flush":
            stream.flush()
        elif kind == "text":
            stream.push_text(message[2])
        elif kind == "end":
            stream.end()
        elif kind == "close":
            stream.close()
    except ValueError:  # bad audio: the stream has failed, and its pump says so
        pass


def main(argv: list[str]) -> int:
    """`python -m engine.process FD OPTIONS_JSON`: serve one SpeechEngine on socket FD."""
    from .blas import single_threaded_blas
    from .malloc import bound_and_trim

    single_threaded_blas()  # as in the gateway: numpy's idle BLAS threads spin
    bound_and_trim()  # as in the gateway, before the engine's threads start: arenas fragment
    sock = socket.socket(fileno=int(argv[0]))
    sender = _Sender(sock)
    root = logging.getLogger()
    root.addHandler(_LogToGateway(sender))
    root.setLevel(logging.INFO)
    # The whole process gives way to the gateway's event loop: this thread (messages in and
    # out) ENGINE_NICE lower, and the threads it starts inherit that; the engine lowers its
    # compute threads by as much again (engine/priority.py), below this thread.
    os.nice(ENGINE_NICE)
    try:
        engine = _build(json.loads(argv[1]))
    except BaseException as exc:
        try:
            pickle.dumps(exc)
        except Exception:
            exc = RuntimeError(f"{type(exc).__name__}: {exc}")
        sender.send(("error", exc))
        return 1
    sock.setblocking(False)
    asyncio.run(_serve(engine, sock, sender))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

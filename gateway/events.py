"""The `events` data channel: server-to-client JSON events in a {type, seq, t} envelope.

Every event a call emits is numbered (seq starts at 1) and timestamped (t, Unix seconds).
Events raised before the client's channel opens are queued and sent on open, so the
client sees an unbroken sequence. A resumed session continues its numbering, and the
events the client missed are replayed first, with their original seq. Client messages
(JSON objects with a `type`) go to the handler registered for their type (`ping` here, others
by the call's mode); anything malformed gets an `error` event and the call goes on. The schema
is documented in docs/events.md.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from typing import Any, Callable, Deque, Optional

MAX_QUEUED_EVENTS = 256  # held until the channel opens; oldest dropped beyond this
MAX_CLIENT_MESSAGE_BYTES = 16 * 1024
FLUSH_POLL_S = 0.02  # how often flushed() checks the channel's send buffer
FLUSH_GRACE_S = 0.1  # after the buffer empties, time for SCTP to put the last chunk on the wire


EmitHook = Callable[[dict, str], None]  # (event, its JSON) for every event emitted
MessageHandler = Callable[[dict], None]  # one client message of the type it was registered for


class BadClientMessage(ValueError):
    """Raised by a MessageHandler for a message with invalid fields; its text becomes the
    `error` event's message (code `bad_message`), and the call goes on."""


class EventChannel:
    def __init__(self, last_seq: int = 0, on_emit: Optional[EmitHook] = None) -> None:
        self.seq = last_seq
        self._channel: Any = None
        self._pending: Deque[str] = deque(maxlen=MAX_QUEUED_EVENTS)
        self._handlers: dict[str, MessageHandler] = {"ping": self._pong}
        self._on_emit = on_emit
        self.sent = 0
        self.last_message_at: Optional[float] = None  # monotonic time of the client's last message

    def attach(self, channel: Any) -> None:
        """Adopt the client's RTCDataChannel; flush queued events once it is open."""
        self._channel = channel
        channel.on("open", self._flush)
        channel.on("message", self.receive)
        if channel.readyState == "open":
            self._flush()

    def handle(self, type_: str, handler: MessageHandler) -> None:
        """Route client messages of `type_` to `handler` (other types get `unknown_message`)."""
        self._handlers[type_] = handler

    @property
    def is_open(self) -> bool:
        return self._channel is not None and self._channel.readyState == "open"

    def emit(self, type_: str, **fields: Any) -> dict:
        self.seq += 1
        event = {"type": type_, "seq": self.seq, "t": round(time.time(), 3), **fields}
        text = json.dumps(event, separators=(",", ":"))
        if self._on_emit is not None:
            self._on_emit(event, text)
        self._deliver(text)
        return event

    def replay(self, texts: list[str]) -> None:
        """Send already-numbered events again (a resumed session's missed ones), in order."""
        for text in texts:
            self._deliver(text)

    def _deliver(self, text: str) -> None:
        if self.is_open:
            self._send(text)
        else:
            self._pending.append(text)

    def error(self, code: str, message: str) -> dict:
        return self.emit("error", code=code, message=message)

    async def flushed(self, timeout_s: float) -> None:
        """Wait (at most `timeout_s`) until what was sent has left the channel's buffer."""
        if not self.is_open:
            return
        deadline = time.monotonic() + timeout_s
        while self.is_open and self._channel.bufferedAmount > 0 and time.monotonic() < deadline:
            await asyncio.sleep(FLUSH_POLL_S)
        await asyncio.sleep(min(FLUSH_GRACE_S, max(0.0, deadline - time.monotonic())))

    def _flush(self) -> None:
        while self._pending and self.is_open:
            self._send(self._pending.popleft())

    def _send(self, text: str) -> None:
        try:
            self._channel.send(text)
            self.sent += 1
        except Exception:  # the transport closed under us; the call is ending
            pass

    def receive(self, message: Any) -> None:
        """One client message, as the data channel delivers it: a JSON object with a `type`,
        for that type's handler; anything else gets an `error` event."""
        self.last_message_at = time.monotonic()
        if isinstance(message, bytes) or len(message) > MAX_CLIENT_MESSAGE_BYTES:
            self.error("bad_message", "client messages must be JSON text under 16 KiB")
            return
        try:
            parsed = json.loads(message)
        except ValueError:
            self.error("bad_message", "client message is not valid JSON")
            return
        if not isinstance(parsed, dict) or not isinstance(parsed.get("type"), str):
            self.error("bad_message", "client message must be an object with a string 'type'")
            return
        handler = self._handlers.get(parsed["type"])
        if handler is None:
            self.error("unknown_message", f"unknown client message type {parsed['type'][:40]!r}")
            return
        try:
            handler(parsed)
        except BadClientMessage as exc:
            self.error("bad_message", str(exc))

    def _pong(self, message: dict) -> None:
        self.emit("pong", ping_id=message.get("id"))

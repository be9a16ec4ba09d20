"""A session record and the store interface every backend keeps.

A record is what a call needs to survive a dropped connection or a dead node: its settings,
the dialog (gateway/dialog.py: history and the reply in progress) and the last event seq sent.

Leases: the lease is the single source of truth for ownership. `get` fills a record's
`owner_node` and `lease_expires_at` from it, and those fields are never stored in the
record. A lease means two nodes never drive one session at once: only the holder may renew
or release it, and anyone may take it once it has expired. A node that wants a session
another node holds (the caller reconnected there) posts a takeover request; the holder's
next renewal fails with TakeoverRequested, and it writes what is pending, stops driving the
session and releases the lease. The request is also published to the holder, which acts on
it at once; the renewal is the fallback if the message is missed. So a live holder hands
over in milliseconds (with nothing lost), and a dead one within one lease TTL.

Updates are optimistic: a record carries a `version`; `update` succeeds only when the stored
version still equals it and returns the record with `version + 1`.

Records never contain the resume token (see gateway/tokens.py): tokens are stateless and
verified with the server secret, so nothing secret is stored here.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any, AsyncIterator, Optional, Protocol

from ..dialog import PendingTurn, Turn, history_from_dicts, pending_from_dict

DEFAULT_SESSION_TTL_S = 3600.0  # a session nobody touches for this long is forgotten
MAX_REPLAY_EVENTS = 256  # events kept per session for replay on reconnect
MAX_RECORD_BYTES = 64 * 1024  # an encoded record above this is refused: keep records small
FORBIDDEN_SETTINGS_KEYS = frozenset({"resume_token"})  # secrets never stored in a record


class SessionError(Exception):
    """Base of every error the session stores raise on purpose."""


class SessionNotFound(SessionError):
    """No such session (never created, deleted, or expired)."""


class SessionExists(SessionError):
    """`create` was given an id that is already in use."""


class VersionConflict(SessionError):
    """The record changed since it was read; re-read it and apply the change again."""


class LeaseHeld(SessionError):
    """Another node holds the session's lease."""


class LeaseLost(SessionError):
    """This node does not hold the lease it tried to renew (it expired or another node took it)."""


class TakeoverRequested(LeaseLost):
    """Another node asked for the session: write what is pending, then release the lease."""


class StoreUnavailable(SessionError):
    """The backing store (Redis) could not be reached or did not answer in time."""


class RecordTooLarge(SessionError, ValueError):
    """The encoded record exceeds MAX_RECORD_BYTES."""


@dataclass
class SessionRecord:
    session_id: str
    settings: dict[str, Any] = field(default_factory=dict)
    history: list[Turn] = field(default_factory=list)
    in_progress: Optional[PendingTurn] = None
    last_event_seq: int = 0  # the last event seq sent to the client
    last_turn: int = 0  # the last reply's `turn` number: a resumed session numbers its replies on from it
    created_at: float = 0.0  # Unix seconds
    updated_at: float = 0.0  # Unix seconds
    version: int = 0  # bumped by every successful update
    owner_node: Optional[str] = None  # filled from the lease by get(); not stored
    lease_expires_at: Optional[float] = None  # Unix seconds; filled from the lease; not stored


LEASE_FIELDS = ("owner_node", "lease_expires_at")


def encode_record(record: SessionRecord) -> str:
    """Compact JSON of the stored fields; refuses secrets and oversized records."""
    forbidden = FORBIDDEN_SETTINGS_KEYS & set(record.settings)
    if forbidden:
        raise ValueError(f"settings must not contain {sorted(forbidden)}")
    data = asdict(record)
    for name in LEASE_FIELDS:
        del data[name]
    text = json.dumps(data, separators=(",", ":"))
    if len(text.encode()) > MAX_RECORD_BYTES:
        raise RecordTooLarge(f"session record is {len(text.encode())} bytes; the limit is {MAX_RECORD_BYTES}")
    return text


def decode_record(text: str) -> SessionRecord:
    data = json.loads(text)
    data["history"] = history_from_dicts(data["history"])
    data["in_progress"] = pending_from_dict(data["in_progress"])
    return SessionRecord(**data)


def event_seq(event_json: str) -> int:
    """The `seq` of an event in the data-channel envelope (docs/events.md)."""
    seq = json.loads(event_json).get("seq")
    if not isinstance(seq, int) or isinstance(seq, bool):
        raise ValueError("event JSON must carry an integer seq")
    return seq


def new_record(session_id: str, settings: Optional[dict[str, Any]]) -> SessionRecord:
    now = time.time()
    return SessionRecord(session_id, dict(settings or {}), created_at=now, updated_at=now)


class SessionStore(Protocol):
    """Where session state lives. Every method may raise StoreUnavailable."""

    async def create(self, session_id: str, settings: Optional[dict[str, Any]] = None) -> SessionRecord:
        """A new record with version 0; SessionExists if the id is taken."""

    async def get(self, session_id: str) -> SessionRecord:
        """The record with its live lease fields; SessionNotFound if absent or expired."""

    async def update(self, record: SessionRecord) -> SessionRecord:
        """Store `record` if the stored version is still `record.version`; returns it with
        version + 1 and a fresh updated_at. VersionConflict or SessionNotFound otherwise.
        Refreshes the TTL of the session and its event log."""

    async def put(self, record: SessionRecord, events: Optional[list[str]] = None) -> None:
        """Store `record` as it is, unconditionally (the lease holder's write-behind), creating
        it if absent; with `events`, the replay log is replaced by them (restore after an outage)."""

    async def append_event(self, session_id: str, event_json: str) -> None:
        """Add one event (with an integer `seq`) to the bounded replay log."""

    async def events_since(self, session_id: str, seq: int) -> list[str]:
        """The logged events with seq > `seq`, oldest first. If the first one's seq is above
        seq + 1, the events in between have fallen out of the log."""

    async def acquire_lease(self, session_id: str, node_id: str, ttl_s: float) -> float:
        """Take (or, for the holder, extend) the lease; returns its expiry (Unix s). LeaseHeld
        if another node holds it."""

    async def renew_lease(self, session_id: str, node_id: str, ttl_s: float) -> float:
        """Extend the lease held by `node_id`; returns the new expiry. LeaseLost otherwise."""

    async def release_lease(self, session_id: str, node_id: str) -> bool:
        """Drop the lease if `node_id` holds it; True if it did."""

    async def request_takeover(self, session_id: str, node_id: str, ttl_s: float) -> None:
        """Ask the lease holder to let go: it is told through takeover_requests, and its next
        renew_lease raises TakeoverRequested; once it releases the lease (or the lease
        expires), `node_id` can acquire it."""

    def takeover_requests(self, node_id: str) -> AsyncIterator[str]:
        """Session ids that other nodes ask `node_id` to let go, as they are asked. Raises
        StoreUnavailable when the store goes away (subscribe again later)."""

    async def delete(self, session_id: str) -> bool:
        """Remove the record, its event log and its lease; True if the record existed."""

    async def ping(self) -> None:
        """Return if the store answers; StoreUnavailable otherwise."""

    async def close(self) -> None:
        """Release connections."""

"""The in-process session store: the embedded default (one node, lost on restart).

It keeps the same semantics as the Redis store (gateway/sessions/redis.py), expiry checked on
access, so tests/test_sessions.py runs one suite against both. What has expired is also swept
away once a minute (as a new session is made, by create() or by put(): the gateway's keeper
makes them with put), as Redis drops expired keys by itself: checked on access alone, a session
nobody asked for again stayed in memory for good.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Deque, Optional

from .record import (DEFAULT_SESSION_TTL_S, MAX_REPLAY_EVENTS, LeaseHeld, LeaseLost, SessionExists,
                     SessionNotFound, SessionRecord, TakeoverRequested, VersionConflict, decode_record,
                     encode_record, event_seq, new_record)


SWEEP_EVERY_S = 60.0  # how often a new session sweeps expired ones away


@dataclass
class _MemoryEntry:
    record_json: str
    expires_at: float  # time.monotonic()
    events: Deque[tuple[int, str]] = field(default_factory=lambda: deque(maxlen=MAX_REPLAY_EVENTS))


class MemorySessionStore:
    """In-process store with the same semantics as Redis, expiry checked on access.

    No method awaits while it touches the dicts, so the event loop makes each one atomic.
    """

    def __init__(self, session_ttl_s: float = DEFAULT_SESSION_TTL_S) -> None:
        self.session_ttl_s = session_ttl_s
        self._next_sweep = time.monotonic() + SWEEP_EVERY_S
        self._entries: dict[str, _MemoryEntry] = {}
        self._leases: dict[str, tuple[str, float]] = {}  # id -> (node, expiry in Unix s)
        self._takeovers: dict[str, tuple[str, float]] = {}  # id -> (asking node, expiry in Unix s)
        self._takeover_queues: dict[str, asyncio.Queue[str]] = {}  # holder node -> requests for it

    def _entry(self, session_id: str) -> _MemoryEntry:
        entry = self._entries.get(session_id)
        if entry is not None and entry.expires_at <= time.monotonic():
            del self._entries[session_id]
            entry = None
        if entry is None:
            raise SessionNotFound(f"session {session_id} not found")
        return entry

    def _lease(self, session_id: str) -> Optional[tuple[str, float]]:
        lease = self._leases.get(session_id)
        if lease is not None and lease[1] <= time.time():
            del self._leases[session_id]
            lease = None
        return lease

    def _touch(self, entry: _MemoryEntry) -> None:
        entry.expires_at = time.monotonic() + self.session_ttl_s

    def _sweep_when_due(self) -> None:
        if time.monotonic() >= self._next_sweep:
            self._sweep()

    def _sweep(self) -> None:
        """Forget every session, lease and takeover request that has expired."""
        now, wall = time.monotonic(), time.time()
        self._next_sweep = now + SWEEP_EVERY_S
        for session_id in [k for k, entry in self._entries.items() if entry.expires_at <= now]:
            del self._entries[session_id]
        for held in (self._leases, self._takeovers):
            for session_id in [k for k, (_, expiry) in held.items() if expiry <= wall]:
                del held[session_id]

    async def create(self, session_id: str, settings: Optional[dict[str, Any]] = None) -> SessionRecord:
        self._sweep_when_due()
        try:
            self._entry(session_id)
        except SessionNotFound:
            record = new_record(session_id, settings)
            self._entries[session_id] = _MemoryEntry(encode_record(record), 0.0)
            self._touch(self._entries[session_id])
            return record
        raise SessionExists(f"session {session_id} already exists")

    async def get(self, session_id: str) -> SessionRecord:
        record = decode_record(self._entry(session_id).record_json)
        lease = self._lease(session_id)
        if lease is not None:
            record.owner_node, record.lease_expires_at = lease
        return record

    async def update(self, record: SessionRecord) -> SessionRecord:
        entry = self._entry(record.session_id)
        stored = decode_record(entry.record_json)
        if stored.version != record.version:
            raise VersionConflict(f"session {record.session_id} is at version {stored.version}, "
                                  f"not {record.version}")
        updated = copy.deepcopy(record)
        updated.version, updated.updated_at = record.version + 1, time.time()
        entry.record_json = encode_record(updated)
        self._touch(entry)
        return updated

    async def put(self, record: SessionRecord, events: Optional[list[str]] = None) -> None:
        encoded = encode_record(record)
        try:
            entry = self._entry(record.session_id)
            entry.record_json = encoded
        except SessionNotFound:
            self._sweep_when_due()
            entry = self._entries[record.session_id] = _MemoryEntry(encoded, 0.0)
        if events is not None:
            entry.events.clear()
            entry.events.extend((event_seq(text), text) for text in events)
        self._touch(entry)

    async def append_event(self, session_id: str, event_json: str) -> None:
        seq = event_seq(event_json)
        entry = self._entry(session_id)
        entry.events.append((seq, event_json))
        self._touch(entry)

    async def events_since(self, session_id: str, seq: int) -> list[str]:
        return [text for event_seq_, text in self._entry(session_id).events if event_seq_ > seq]

    def _takeover(self, session_id: str) -> Optional[str]:
        asked = self._takeovers.get(session_id)
        if asked is not None and asked[1] <= time.time():
            del self._takeovers[session_id]
            asked = None
        return asked[0] if asked else None

    async def acquire_lease(self, session_id: str, node_id: str, ttl_s: float) -> float:
        lease = self._lease(session_id)
        if lease is not None and lease[0] != node_id:
            raise LeaseHeld(f"session {session_id} is driven by node {lease[0]}")
        if self._takeover(session_id) == node_id:
            del self._takeovers[session_id]
        expiry = time.time() + ttl_s
        self._leases[session_id] = (node_id, expiry)
        return expiry

    async def renew_lease(self, session_id: str, node_id: str, ttl_s: float) -> float:
        lease = self._lease(session_id)
        if lease is None or lease[0] != node_id:
            raise LeaseLost(f"node {node_id} does not hold the lease of session {session_id}")
        asking = self._takeover(session_id)
        if asking is not None and asking != node_id:
            raise TakeoverRequested(f"node {asking} asked for session {session_id}")
        return await self.acquire_lease(session_id, node_id, ttl_s)

    async def request_takeover(self, session_id: str, node_id: str, ttl_s: float) -> None:
        self._takeovers[session_id] = (node_id, time.time() + ttl_s)
        lease = self._lease(session_id)
        if lease is not None and lease[0] in self._takeover_queues:
            self._takeover_queues[lease[0]].put_nowait(session_id)

    async def takeover_requests(self, node_id: str) -> AsyncIterator[str]:
        queue = self._takeover_queues.setdefault(node_id, asyncio.Queue())
        try:
            while True:
                yield await queue.get()
        finally:
            self._takeover_queues.pop(node_id, None)

    async def release_lease(self, session_id: str, node_id: str) -> bool:
        lease = self._lease(session_id)
        if lease is None or lease[0] != node_id:
            return False
        del self._leases[session_id]
        return True

    async def delete(self, session_id: str) -> bool:
        self._leases.pop(session_id, None)
        self._takeovers.pop(session_id, None)
        try:
            self._entry(session_id)
        except SessionNotFound:
            return False
        del self._entries[session_id]
        return True

    async def ping(self) -> None:
        pass

    async def close(self) -> None:
        pass

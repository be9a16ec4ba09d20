"""This node's side of session state: live copies, write-behind to the store, leases.

A call never waits on Redis once it runs. The keeper holds the authoritative copy of every
session this node drives (record plus the last MAX_REPLAY_EVENTS events) and writes changes
behind, in order, through one bounded queue. If the store goes away, calls go on; writes
wait (oldest dropped past MAX_PENDING_WRITES, which is safe: on recovery every live session
is restored whole from its local copy, so a Redis that restarted empty gets everything
back). Outages and recoveries are logged once each, not per write.

Leases are renewed every lease_ttl_s / 3. A takeover request (pushed by the store, or a
renewal answered with TakeoverRequested) means the caller reconnected to another node:
this node writes what is pending, releases the lease and closes its call. A lease that lapsed is retaken if it is free; if another node
holds it by then, the call is closed at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Deque, Optional

from .sessions import (DEFAULT_SESSION_TTL_S, MAX_REPLAY_EVENTS, LeaseHeld, LeaseLost, SessionNotFound,
                       SessionRecord, SessionStore, StoreUnavailable, TakeoverRequested, event_seq, new_record)

log = logging.getLogger("parley.sessions")

MAX_PENDING_WRITES = 10_000  # write-behind queue bound
MAX_RECENT_SESSIONS = 1024  # ended sessions kept locally, so a same-node resume works during an outage
# ^ each for as long as the store keeps it too (session_ttl_s): its resume token has expired by then
RETRY_MIN_S, RETRY_MAX_S = 0.2, 2.0  # write-behind retry backoff while the store is away
TAKEOVER_POLL_S = 0.1
EPHEMERAL_EVENTS = frozenset({"call.stats", "pong", "session.migrate", "session.ended"})
# ^ not logged for replay: stale on arrival, or about the connection that ended (replaying a
#   session.ended or session.migrate would end or move the new one; migrate also holds a token)

LeaseLostHandler = Callable[[str], Awaitable[None]]


class SessionBusy(Exception):
    """Another node still drives the session and did not hand it over in time."""


@dataclass
class LiveSession:
    record: SessionRecord
    events: Deque[str] = field(default_factory=lambda: deque(maxlen=MAX_REPLAY_EVENTS))
    leased: bool = False
    ended_at: float = 0.0  # time.monotonic() when its call here ended (a copy in `recent`)


class SessionKeeper:
    def __init__(self, store: SessionStore, node_id: str, lease_ttl_s: float,
                 allow_new_without_store: bool = True, session_ttl_s: float = DEFAULT_SESSION_TTL_S) -> None:
        self.store = store
        self.node_id = node_id
        self.lease_ttl_s = lease_ttl_s
        self.session_ttl_s = session_ttl_s  # the store's: how long an ended session's copy is kept
        self.allow_new_without_store = allow_new_without_store
        self.live: dict[str, LiveSession] = {}
        self.recent: OrderedDict[str, LiveSession] = OrderedDict()
        self.on_lease_lost: Optional[LeaseLostHandler] = None
        self.available = True
        self.dropped_writes = 0
        self._writes: Deque[tuple[str, str, Optional[str]]] = deque()  # (kind, session id, event json)
        self._queued_records: set[str] = set()
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._handing_over: set[str] = set()

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._write_behind()), loop.create_task(self._renew_leases()),
                       loop.create_task(self._listen_for_takeovers())]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.flush(timeout_s=2.0)
        for session_id in list(self.live):
            await self._release(session_id)
        await self.store.close()

    # -- opening and ending a session ------------------------------------------------------------

    async def open_new(self, session_id: str, settings: Optional[dict[str, Any]] = None) -> LiveSession:
        """A fresh session driven by this node, with these settings (its named flow). StoreUnavailable
        when the store is away and new sessions must not start without it."""
        session = LiveSession(new_record(session_id, settings))
        try:
            await self.store.put(session.record, [])
            await self.store.acquire_lease(session_id, self.node_id, self.lease_ttl_s)
            session.leased = True
            self._store_came_back()
        except StoreUnavailable as exc:
            self._store_went_away(exc)
            if not self.allow_new_without_store:
                raise
        self.live[session_id] = session
        return session

    async def resume(self, session_id: str) -> LiveSession:
        """Take over an existing session: SessionNotFound, SessionBusy or StoreUnavailable."""
        self._forget_expired()
        local = self.live.pop(session_id, None) or self.recent.pop(session_id, None)
        try:
            await self._take_lease(session_id)  # first: the previous holder has written all it had
            session = await self._load(session_id, local)
            session.leased = True
            self._store_came_back()
        except StoreUnavailable as exc:
            self._store_went_away(exc)
            if local is None:
                raise
            session = local  # this node drove it last; go on from the local copy
        self.live[session_id] = session
        return session

    async def _load(self, session_id: str, local: Optional[LiveSession]) -> LiveSession:
        try:
            record = await self.store.get(session_id)
        except SessionNotFound:
            if local is None:
                raise
            await self.store.put(local.record, list(local.events))  # Redis lost it; ours is whole
            return local
        if local is not None and local.record.last_event_seq >= record.last_event_seq:
            return local  # written behind by this node: the local copy is at least as fresh
        events = await self.store.events_since(session_id, 0)
        # Numbering must never repeat, even if the record write lagged behind the last event's.
        record.last_event_seq = max([record.last_event_seq, *(event_seq(text) for text in events)])
        return LiveSession(record, deque(events, maxlen=MAX_REPLAY_EVENTS))

    async def _take_lease(self, session_id: str) -> None:
        """Acquire the lease, asking a live holder to let go; it does within one renewal."""
        deadline = time.monotonic() + self.lease_ttl_s + 1.0
        asked = False
        while True:
            try:
                await self.store.acquire_lease(session_id, self.node_id, self.lease_ttl_s)
                return
            except LeaseHeld:
                if time.monotonic() > deadline:
                    raise SessionBusy(f"session {session_id} is still driven by another node") from None
                if not asked:
                    await self.store.request_takeover(session_id, self.node_id, self.lease_ttl_s + 1.0)
                    asked = True
                await asyncio.sleep(TAKEOVER_POLL_S)

    async def end(self, session_id: str) -> None:
        """The call ended on this node: write what is pending, let go of the lease, keep a copy."""
        session = self.live.get(session_id)
        if session is None:
            return
        await self.flush(timeout_s=1.0, session_id=session_id)
        if self.live.get(session_id) is session:
            await self._release(session_id)
            session.ended_at = time.monotonic()
            self.recent[session_id] = session
            self._forget_expired()

    def _forget_expired(self) -> None:
        """Drop the ended sessions' copies the store has forgotten by now, and the oldest past
        MAX_RECENT_SESSIONS. Without the first, a node at 60 calls a minute held 1024 ended
        calls' histories whatever the TTL (bench/soak.py: the node's RSS rose for 16 minutes)."""
        oldest_kept = time.monotonic() - self.session_ttl_s
        while self.recent:
            session_id, session = next(iter(self.recent.items()))
            if len(self.recent) <= MAX_RECENT_SESSIONS and session.ended_at > oldest_kept:
                break  # `recent` is in order of ending: the rest ended later
            del self.recent[session_id]

    async def _release(self, session_id: str) -> None:
        session = self.live.pop(session_id, None)
        if session is None or not session.leased:
            return
        with contextlib.suppress(StoreUnavailable):
            await self.store.release_lease(session_id, self.node_id)

    # -- changes while a call runs ------------------------------------------------------------

    def record_event(self, session_id: str, event: dict, text: str) -> None:
        """Called for every event a call sends: remembered for replay, written behind."""
        session = self.live.get(session_id)
        if session is None:
            return
        session.record.last_event_seq = max(session.record.last_event_seq, event["seq"])
        if event["type"] in EPHEMERAL_EVENTS:
            return
        session.events.append(text)
        self._enqueue(("event", session_id, text))
        self.save(session_id)

    def save(self, session_id: str) -> None:
        """The record changed; write it behind (coalesced: one pending write per session)."""
        if session_id in self._queued_records or session_id not in self.live:
            return
        self._queued_records.add(session_id)
        self._enqueue(("record", session_id, None))

    def _enqueue(self, write: tuple[str, str, Optional[str]]) -> None:
        if len(self._writes) >= MAX_PENDING_WRITES:
            kind, session_id, _ = self._writes.popleft()
            if kind == "record":
                self._queued_records.discard(session_id)
            if self.dropped_writes == 0:
                log.warning("session write-behind queue full: dropping the oldest writes "
                            "(live sessions are restored whole when the store returns)")
            self.dropped_writes += 1
        self._writes.append(write)
        self._wake.set()

    def replay_after(self, session_id: str, seq: int) -> list[str]:
        """Logged events the client has not seen (seq above `seq`), oldest first."""
        session = self.live.get(session_id)
        if session is None:
            return []
        return [text for text in session.events if event_seq(text) > seq]

    async def flush(self, timeout_s: float, session_id: Optional[str] = None) -> bool:
        """Wait until nothing (for `session_id`, or at all) is pending; False on timeout."""
        deadline = time.monotonic() + timeout_s
        while any(session_id in (None, sid) for _, sid, _ in self._writes):
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.01)
        return True

    # -- background ---------------------------------------------------------------------------

    async def _write_behind(self) -> None:
        backoff = RETRY_MIN_S
        while True:
            if not self.available:
                try:
                    await self._recover()
                except StoreUnavailable:
                    await asyncio.sleep(backoff)
                    backoff = min(RETRY_MAX_S, backoff * 2)
                    continue
                backoff = RETRY_MIN_S
            if not self._writes:
                self._wake.clear()
                await self._wake.wait()
                continue
            kind, session_id, _ = write = self._writes[0]
            if kind == "record":
                # The record is encoded as it is sent, so a change made while it is on the wire
                # needs a write of its own: no longer "queued" from here on.
                self._queued_records.discard(session_id)
            try:
                await self._write(write)
            except StoreUnavailable as exc:
                self._store_went_away(exc)
                continue
            except Exception:  # a bug must not end the loop: every later write would be lost
                log.exception("session write-behind failed; this write is dropped",
                              extra={"session_id": session_id, "write": kind})
            if self._writes and self._writes[0] is write:  # (a full queue may have dropped it meanwhile)
                self._writes.popleft()

    async def _write(self, write: tuple[str, str, Optional[str]]) -> None:
        kind, session_id, text = write
        session = self.live.get(session_id) or self.recent.get(session_id)
        if session is None and kind == "record":
            return
        try:
            if kind == "record":
                await self.store.put(session.record)
            else:
                await self.store.append_event(session_id, text)
        except SessionNotFound:
            if session is not None:  # the store lost it (restarted empty): restore it whole
                await self.store.put(session.record, list(session.events))

    async def _recover(self) -> None:
        """Probe the store; once it answers, restore every live session whole and retake its lease."""
        await self.store.ping()
        restored = 0
        for session_id, session in list(self.live.items()):
            await self.store.put(session.record, list(session.events))
            try:
                await self.store.acquire_lease(session_id, self.node_id, self.lease_ttl_s)
                session.leased = True
            except LeaseHeld:
                await self._lost(session_id)
            restored += 1
        self._store_came_back(restored)

    async def _renew_leases(self) -> None:
        while True:
            await asyncio.sleep(self.lease_ttl_s / 3)
            if not self.available:
                continue  # recovery retakes every lease
            for session_id, session in list(self.live.items()):
                try:
                    await self._renew(session_id, session)
                except TakeoverRequested:
                    await self._hand_over(session_id)
                except LeaseHeld:
                    await self._lost(session_id)
                except StoreUnavailable as exc:
                    self._store_went_away(exc)
                    break

    async def _renew(self, session_id: str, session: LiveSession) -> None:
        """Extend the lease; one that lapsed (Redis restarted, a stall) is retaken if free."""
        if session.leased:
            try:
                await self.store.renew_lease(session_id, self.node_id, self.lease_ttl_s)
                return
            except TakeoverRequested:
                raise
            except LeaseLost:
                session.leased = False
        await self.store.acquire_lease(session_id, self.node_id, self.lease_ttl_s)
        session.leased = True

    async def _listen_for_takeovers(self) -> None:
        while True:
            try:
                async for session_id in self.store.takeover_requests(self.node_id):
                    if session_id in self.live:
                        asyncio.get_running_loop().create_task(self._hand_over(session_id))
            except StoreUnavailable:
                pass  # the write-behind loop reports and probes; subscribe again shortly
            await asyncio.sleep(RETRY_MAX_S)

    async def _hand_over(self, session_id: str) -> None:
        """Another node asked for this session: write what is pending, let go, close the call."""
        if session_id in self._handing_over:
            return
        self._handing_over.add(session_id)
        try:
            await self.flush(timeout_s=1.0, session_id=session_id)
            session = self.live.get(session_id)
            if session is not None:
                await self._release(session_id)
                self.recent.pop(session_id, None)
                await self._lost(session_id, session)
        finally:
            self._handing_over.discard(session_id)

    async def _lost(self, session_id: str, session: Optional[LiveSession] = None) -> None:
        session = self.live.pop(session_id, None) or session
        if session is None:
            return
        session.leased = False
        log.info("session taken over by another node", extra={"session_id": session_id})
        if self.on_lease_lost is not None:
            await self.on_lease_lost(session_id)

    def _store_went_away(self, exc: Exception) -> None:
        if self.available:
            log.warning("session store unavailable; live calls go on, writes are queued",
                        extra={"error": str(exc)})
        self.available = False
        self._wake.set()  # the write-behind loop notices recovery and restores

    def _store_came_back(self, restored: int = 0) -> None:
        if not self.available:
            log.info("session store is back; live sessions restored",
                     extra={"restored_sessions": restored, "dropped_writes": self.dropped_writes})
        self.available = True
        self.dropped_writes = 0

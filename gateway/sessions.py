"""Session storage: what a call needs to survive a dropped connection or a dead node.

One interface, `SessionStore`, with two backends:

- `MemorySessionStore`: in-process, the embedded default (one node, lost on restart).
- `RedisSessionStore`: redis-py asyncio, shared by every node that points at the same Redis.

Redis key layout (every key has a TTL; values are small JSON or plain strings):

    parley:session:{id}   JSON SessionRecord (without lease fields)   PX session_ttl_s
    parley:events:{id}    list of event JSON, newest last, the last MAX_REPLAY_EVENTS
                          (RPUSH + LTRIM)                              PX session_ttl_s
    parley:lease:{id}     owner node id (SET NX PX)                    PX lease ttl_s
    parley:takeover:{id}  node id asking the holder to let go          PX lease ttl_s
    parley:takeovers:{node}  pub/sub channel: session ids that node is asked to let go

The lease key is the single source of truth for ownership: `get` fills a record's
`owner_node` and `lease_expires_at` from it, and those fields are never stored in the
record. A lease means two nodes never drive one session at once: only the holder may renew
or release it, and anyone may take it once it has expired. A node that wants a session
another node holds (the caller reconnected there) posts a takeover request; the holder's
next renewal fails with TakeoverRequested, and it writes what is pending, stops driving the
session and releases the lease. The request is also published to the holder, which acts on
it at once; the renewal is the fallback if the message is missed. So a live holder hands
over in milliseconds (with nothing lost), and a dead one within one lease TTL.

Updates are optimistic: a record carries a `version`; `update` succeeds only when the stored
version still equals it (Redis: WATCH/MULTI) and returns the record with `version + 1`.

Records never contain the resume token (see gateway/tokens.py): tokens are stateless and
verified with the server secret, so nothing secret is stored here.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, AsyncIterator, Deque, Iterator, Optional, Protocol

import redis.asyncio as aioredis
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.exceptions import WatchError
from redis.retry import Retry

KEY_PREFIX = "parley"
DEFAULT_SESSION_TTL_S = 3600.0  # a session nobody touches for this long is forgotten
MAX_REPLAY_EVENTS = 256  # events kept per session for replay on reconnect
MAX_RECORD_BYTES = 64 * 1024  # an encoded record above this is refused: keep records small
REDIS_SOCKET_TIMEOUT_S = 1.0  # a Redis that does not answer within this raises StoreUnavailable
FORBIDDEN_SETTINGS_KEYS = frozenset({"resume_token"})  # secrets never stored in a record


class SessionError(Exception):
    """Base of every error this module raises on purpose."""


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
class Turn:
    """One finished turn. For the assistant, `heard_text` is what was played before a barge-in."""

    role: str  # "user" | "assistant"
    text: str
    heard_text: Optional[str] = None


@dataclass
class PendingTurn:
    """The assistant turn being spoken: its full text and how much of it has been played."""

    text: str
    played_ms: int = 0
    heard_text: str = ""  # the words played so far: a resumed session continues after them


@dataclass
class SessionRecord:
    session_id: str
    settings: dict[str, Any] = field(default_factory=dict)
    history: list[Turn] = field(default_factory=list)
    in_progress: Optional[PendingTurn] = None
    last_event_seq: int = 0  # the last event seq sent to the client
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
    data["history"] = [Turn(**turn) for turn in data["history"]]
    if data["in_progress"] is not None:
        data["in_progress"] = PendingTurn(**data["in_progress"])
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

    async def create(self, session_id: str, settings: Optional[dict[str, Any]] = None) -> SessionRecord:
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


# KEYS[1] session, KEYS[2] events; ARGV[1] event, ARGV[2] max events, ARGV[3] ttl ms.
APPEND_EVENT_LUA = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('RPUSH', KEYS[2], ARGV[1])
redis.call('LTRIM', KEYS[2], -tonumber(ARGV[2]), -1)
redis.call('PEXPIRE', KEYS[2], ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""
# KEYS[1] lease, KEYS[2] takeover; ARGV[1] node, ARGV[2] ttl ms. 1 if node now holds it, 0 if another does.
ACQUIRE_LEASE_LUA = """
local owner = redis.call('GET', KEYS[1])
if owner and owner ~= ARGV[1] then return 0 end
if redis.call('GET', KEYS[2]) == ARGV[1] then redis.call('DEL', KEYS[2]) end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""
# KEYS[1] lease, KEYS[2] takeover; ARGV[1] node, ARGV[2] ttl ms.
# 1 if renewed, 0 if node does not hold it, -1 if another node asked to take over (not renewed).
RENEW_LEASE_LUA = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local asking = redis.call('GET', KEYS[2])
if asking and asking ~= ARGV[1] then return -1 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""
# KEYS[1] lease, KEYS[2] takeover; ARGV[1] asking node, ARGV[2] ttl ms, ARGV[3] session id,
# ARGV[4] channel prefix. Records the request and tells the holder, if any, on its channel.
REQUEST_TAKEOVER_LUA = """
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
local owner = redis.call('GET', KEYS[1])
if owner and owner ~= ARGV[1] then redis.call('PUBLISH', ARGV[4] .. owner, ARGV[3]) end
return 1
"""
# KEYS[1] lease; ARGV[1] node. 1 if released, 0 if node did not hold it.
RELEASE_LEASE_LUA = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
return redis.call('DEL', KEYS[1])
"""


def session_key(session_id: str) -> str:
    return f"{KEY_PREFIX}:session:{session_id}"


def events_key(session_id: str) -> str:
    return f"{KEY_PREFIX}:events:{session_id}"


def lease_key(session_id: str) -> str:
    return f"{KEY_PREFIX}:lease:{session_id}"


def takeover_key(session_id: str) -> str:
    return f"{KEY_PREFIX}:takeover:{session_id}"


TAKEOVER_CHANNEL_PREFIX = f"{KEY_PREFIX}:takeovers:"


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


@contextmanager
def _redis_errors(url: str) -> Iterator[None]:
    """Turn connection failures and timeouts into StoreUnavailable (with the cause chained)."""
    try:
        yield
    except (RedisConnectionError, RedisTimeoutError, TimeoutError) as exc:
        raise StoreUnavailable(f"redis at {url} is unavailable: {exc}") from exc


class RedisSessionStore:
    """Sessions in Redis, shared by every node using the same URL.

    Fails fast (no retries, REDIS_SOCKET_TIMEOUT_S) so the caller decides what an outage
    means (write-behind queue, in-memory fallback or 503); the client reconnects by itself
    once Redis answers again.
    """

    def __init__(self, url: str, session_ttl_s: float = DEFAULT_SESSION_TTL_S,
                 socket_timeout_s: float = REDIS_SOCKET_TIMEOUT_S) -> None:
        self.url = url
        self.session_ttl_s = session_ttl_s
        self._redis = aioredis.from_url(
            url, decode_responses=True, socket_timeout=socket_timeout_s,
            socket_connect_timeout=socket_timeout_s, retry=Retry(NoBackoff(), 0))
        self._append_event = self._redis.register_script(APPEND_EVENT_LUA)
        self._acquire = self._redis.register_script(ACQUIRE_LEASE_LUA)
        self._renew = self._redis.register_script(RENEW_LEASE_LUA)
        self._release = self._redis.register_script(RELEASE_LEASE_LUA)
        self._request_takeover = self._redis.register_script(REQUEST_TAKEOVER_LUA)

    @property
    def _ttl_ms(self) -> int:
        return _ms(self.session_ttl_s)

    async def create(self, session_id: str, settings: Optional[dict[str, Any]] = None) -> SessionRecord:
        record = new_record(session_id, settings)
        with _redis_errors(self.url):
            created = await self._redis.set(session_key(session_id), encode_record(record),
                                            px=self._ttl_ms, nx=True)
        if not created:
            raise SessionExists(f"session {session_id} already exists")
        return record

    async def get(self, session_id: str) -> SessionRecord:
        with _redis_errors(self.url):
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.get(session_key(session_id))
                pipe.get(lease_key(session_id))
                pipe.pttl(lease_key(session_id))
                raw, owner, lease_ms = await pipe.execute()
        if raw is None:
            raise SessionNotFound(f"session {session_id} not found")
        record = decode_record(raw)
        if owner is not None and lease_ms > 0:
            record.owner_node, record.lease_expires_at = owner, time.time() + lease_ms / 1000
        return record

    async def update(self, record: SessionRecord) -> SessionRecord:
        updated = copy.deepcopy(record)
        updated.version, updated.updated_at = record.version + 1, time.time()
        encoded = encode_record(updated)
        key = session_key(record.session_id)
        with _redis_errors(self.url):
            try:
                async with self._redis.pipeline(transaction=True) as pipe:
                    await pipe.watch(key)
                    raw = await pipe.get(key)
                    self._check_version(record, raw)
                    pipe.multi()
                    pipe.set(key, encoded, px=self._ttl_ms)
                    pipe.pexpire(events_key(record.session_id), self._ttl_ms)
                    await pipe.execute()
            except WatchError:
                raise VersionConflict(f"session {record.session_id} changed during the update") from None
        return updated

    @staticmethod
    def _check_version(record: SessionRecord, raw: Optional[str]) -> None:
        if raw is None:
            raise SessionNotFound(f"session {record.session_id} not found")
        stored = json.loads(raw)["version"]
        if stored != record.version:
            raise VersionConflict(f"session {record.session_id} is at version {stored}, "
                                  f"not {record.version}")

    async def put(self, record: SessionRecord, events: Optional[list[str]] = None) -> None:
        encoded = encode_record(record)
        for text in events or ():
            event_seq(text)
        with _redis_errors(self.url):
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.set(session_key(record.session_id), encoded, px=self._ttl_ms)
                if events is not None:
                    pipe.delete(events_key(record.session_id))
                    if events:
                        pipe.rpush(events_key(record.session_id), *events[-MAX_REPLAY_EVENTS:])
                pipe.pexpire(events_key(record.session_id), self._ttl_ms)
                await pipe.execute()

    async def append_event(self, session_id: str, event_json: str) -> None:
        event_seq(event_json)
        with _redis_errors(self.url):
            appended = await self._append_event(
                keys=[session_key(session_id), events_key(session_id)],
                args=[event_json, MAX_REPLAY_EVENTS, self._ttl_ms])
        if not appended:
            raise SessionNotFound(f"session {session_id} not found")

    async def events_since(self, session_id: str, seq: int) -> list[str]:
        with _redis_errors(self.url):
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.exists(session_key(session_id))
                pipe.lrange(events_key(session_id), 0, -1)
                exists, events = await pipe.execute()
        if not exists:
            raise SessionNotFound(f"session {session_id} not found")
        return [text for text in events if event_seq(text) > seq]

    async def acquire_lease(self, session_id: str, node_id: str, ttl_s: float) -> float:
        with _redis_errors(self.url):
            held = await self._acquire(keys=[lease_key(session_id), takeover_key(session_id)],
                                       args=[node_id, _ms(ttl_s)])
        if not held:
            raise LeaseHeld(f"session {session_id} is driven by another node")
        return time.time() + ttl_s

    async def renew_lease(self, session_id: str, node_id: str, ttl_s: float) -> float:
        with _redis_errors(self.url):
            renewed = await self._renew(keys=[lease_key(session_id), takeover_key(session_id)],
                                        args=[node_id, _ms(ttl_s)])
        if renewed == -1:
            raise TakeoverRequested(f"another node asked for session {session_id}")
        if not renewed:
            raise LeaseLost(f"node {node_id} does not hold the lease of session {session_id}")
        return time.time() + ttl_s

    async def request_takeover(self, session_id: str, node_id: str, ttl_s: float) -> None:
        with _redis_errors(self.url):
            await self._request_takeover(keys=[lease_key(session_id), takeover_key(session_id)],
                                         args=[node_id, _ms(ttl_s), session_id, TAKEOVER_CHANNEL_PREFIX])

    async def takeover_requests(self, node_id: str) -> AsyncIterator[str]:
        pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
        try:
            with _redis_errors(self.url):
                await pubsub.subscribe(TAKEOVER_CHANNEL_PREFIX + node_id)
                while True:
                    message = await pubsub.get_message(timeout=None)
                    if message is not None and message["type"] == "message":
                        yield message["data"]
        finally:
            with contextlib.suppress(Exception):
                await pubsub.aclose()

    async def release_lease(self, session_id: str, node_id: str) -> bool:
        with _redis_errors(self.url):
            return bool(await self._release(keys=[lease_key(session_id)], args=[node_id]))

    async def delete(self, session_id: str) -> bool:
        with _redis_errors(self.url):
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.exists(session_key(session_id))
                pipe.unlink(session_key(session_id), events_key(session_id), lease_key(session_id),
                            takeover_key(session_id))
                existed, _ = await pipe.execute()
        return bool(existed)

    async def ping(self) -> None:
        with _redis_errors(self.url):
            await self._redis.ping()

    async def close(self) -> None:
        await self._redis.aclose()


def open_store(redis_url: Optional[str], session_ttl_s: float = DEFAULT_SESSION_TTL_S) -> SessionStore:
    """The Redis store when a URL is given, else the in-memory one."""
    if redis_url:
        return RedisSessionStore(redis_url, session_ttl_s)
    return MemorySessionStore(session_ttl_s)

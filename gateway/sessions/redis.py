"""The Redis session store: redis-py asyncio, shared by every node that points at the same Redis.

Key layout (every key has a TTL; values are small JSON or plain strings):

    parley:session:{id}   JSON SessionRecord (without lease fields)   PX session_ttl_s
    parley:events:{id}    list of event JSON, newest last, the last MAX_REPLAY_EVENTS
                          (RPUSH + LTRIM)                              PX session_ttl_s
    parley:lease:{id}     owner node id (SET NX PX)                    PX lease ttl_s
    parley:takeover:{id}  node id asking the holder to let go          PX lease ttl_s
    parley:takeovers:{node}  pub/sub channel: session ids that node is asked to let go

Each lease operation is one Lua script, so check-and-set is atomic on the server; `update`
is WATCH/MULTI on the record's key (the version check of gateway/sessions/record.py).
"""

from __future__ import annotations

import contextlib
import copy
import json
import time
from contextlib import contextmanager
from typing import Any, AsyncIterator, Iterator, Optional

import redis.asyncio as aioredis
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.exceptions import WatchError
from redis.retry import Retry

from .record import (DEFAULT_SESSION_TTL_S, MAX_REPLAY_EVENTS, LeaseHeld, LeaseLost, SessionExists,
                     SessionNotFound, SessionRecord, StoreUnavailable, TakeoverRequested, VersionConflict,
                     decode_record, encode_record, event_seq, new_record)

KEY_PREFIX = "parley"
REDIS_SOCKET_TIMEOUT_S = 1.0  # a Redis that does not answer within this raises StoreUnavailable


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

"""Session storage: what a call needs to survive a dropped connection or a dead node.

One interface, `SessionStore` (record.py, with the record itself and the lease rules), and
two backends:

- `MemorySessionStore` (memory.py): in-process, the embedded default (one node, lost on restart).
- `RedisSessionStore` (redis.py): shared by every node that points at the same Redis.

The names are re-exported here, so `from gateway.sessions import ...` is all a user needs.
"""

from __future__ import annotations

from typing import Optional

from ..dialog import PendingTurn, Turn
from .memory import MemorySessionStore
from .record import (DEFAULT_SESSION_TTL_S, FORBIDDEN_SETTINGS_KEYS, LEASE_FIELDS, MAX_RECORD_BYTES,
                     MAX_REPLAY_EVENTS, LeaseHeld, LeaseLost, RecordTooLarge, SessionError, SessionExists,
                     SessionNotFound, SessionRecord, SessionStore, StoreUnavailable, TakeoverRequested,
                     VersionConflict, decode_record, encode_record, event_seq, new_record)
from .redis import (KEY_PREFIX, REDIS_SOCKET_TIMEOUT_S, TAKEOVER_CHANNEL_PREFIX, RedisSessionStore, events_key,
                    lease_key, session_key, takeover_key)

__all__ = [
    "DEFAULT_SESSION_TTL_S", "FORBIDDEN_SETTINGS_KEYS", "KEY_PREFIX", "LEASE_FIELDS", "MAX_RECORD_BYTES",
    "MAX_REPLAY_EVENTS", "REDIS_SOCKET_TIMEOUT_S", "TAKEOVER_CHANNEL_PREFIX", "LeaseHeld", "LeaseLost",
    "MemorySessionStore", "PendingTurn", "RecordTooLarge", "RedisSessionStore", "SessionError", "SessionExists",
    "SessionNotFound", "SessionRecord", "SessionStore", "StoreUnavailable", "TakeoverRequested", "Turn",
    "VersionConflict", "decode_record", "encode_record", "event_seq", "events_key", "lease_key", "new_record",
    "open_store", "session_key", "takeover_key",
]


def open_store(redis_url: Optional[str], session_ttl_s: float = DEFAULT_SESSION_TTL_S) -> SessionStore:
    """The Redis store when a URL is given, else the in-memory one."""
    if redis_url:
        return RedisSessionStore(redis_url, session_ttl_s)
    return MemorySessionStore(session_ttl_s)

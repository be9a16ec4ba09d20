"""The node registry: which gateway nodes share this Redis, and which can take a call.

Each node heartbeats a small JSON status (public URL, ready, draining, load) into Redis:

    parley:node:{id}   JSON NodeStatus                     PX 3 heartbeats
    parley:nodes       set of node ids (stale ids pruned on read)

A draining node answers new calls with 307 to the least-loaded ready peer. Without Redis
there are no peers, and the registry only describes this node.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass
from typing import Optional

import redis.asyncio as aioredis
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry

from .sessions.redis import KEY_PREFIX, REDIS_SOCKET_TIMEOUT_S

log = logging.getLogger("parley.nodes")

NODES_KEY = f"{KEY_PREFIX}:nodes"
HEARTBEATS_PER_TTL = 3  # a node missing this many heartbeats is gone


def node_key(node_id: str) -> str:
    return f"{KEY_PREFIX}:node:{node_id}"


@dataclass
class NodeStatus:
    node_id: str
    url: str  # how clients reach this node's HTTP API ("" = not advertised)
    ready: bool
    draining: bool
    active_sessions: int
    max_sessions: int
    updated_at: float  # Unix seconds

    @property
    def can_take_calls(self) -> bool:
        return bool(self.url) and self.ready and not self.draining and self.active_sessions < self.max_sessions


class NodeRegistry:
    """Heartbeats this node's status and lists its peers (Redis), or stands alone (no Redis)."""

    def __init__(self, redis_url: Optional[str], heartbeat_s: float) -> None:
        self.heartbeat_s = heartbeat_s
        self._redis = None
        if redis_url:
            self._redis = aioredis.from_url(
                redis_url, decode_responses=True, socket_timeout=REDIS_SOCKET_TIMEOUT_S,
                socket_connect_timeout=REDIS_SOCKET_TIMEOUT_S, retry=Retry(NoBackoff(), 0))

    async def publish(self, status: NodeStatus) -> bool:
        """Heartbeat; False (quietly: the session keeper reports Redis outages) when Redis is away."""
        if self._redis is None:
            return False
        ttl_ms = int(self.heartbeat_s * HEARTBEATS_PER_TTL * 1000)
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.set(node_key(status.node_id), json.dumps(asdict(status)), px=ttl_ms)
                pipe.sadd(NODES_KEY, status.node_id)
                await pipe.execute()
        except (RedisError, OSError):
            return False
        return True

    async def remove(self, node_id: str) -> None:
        if self._redis is None:
            return
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.delete(node_key(node_id))
                pipe.srem(NODES_KEY, node_id)
                await pipe.execute()
        except (RedisError, OSError):
            pass

    async def nodes(self) -> list[NodeStatus]:
        """Every node with a live heartbeat; ids whose status expired are pruned."""
        if self._redis is None:
            return []
        try:
            ids = sorted(await self._redis.smembers(NODES_KEY))
            raw = await self._redis.mget([node_key(node_id) for node_id in ids]) if ids else []
            stale = [node_id for node_id, text in zip(ids, raw) if text is None]
            if stale:
                await self._redis.srem(NODES_KEY, *stale)
        except (RedisError, OSError):
            return []
        return [NodeStatus(**json.loads(text)) for text in raw if text is not None]

    async def ready_peer(self, self_id: str) -> Optional[NodeStatus]:
        """The least-loaded other node that can take a call now, if any."""
        peers = [node for node in await self.nodes() if node.node_id != self_id and node.can_take_calls
                 and time.time() - node.updated_at < self.heartbeat_s * HEARTBEATS_PER_TTL]
        return min(peers, key=lambda node: node.active_sessions / node.max_sessions, default=None)

    async def close(self) -> None:
        if self._redis is not None:
            await self._redis.aclose()

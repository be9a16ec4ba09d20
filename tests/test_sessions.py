"""SessionStore: the same behaviour from the in-memory and the Redis backend (a real redis-server)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import AsyncIterator, Awaitable, Callable

import pytest
import redis

from gateway.sessions import (MAX_REPLAY_EVENTS, LeaseHeld, LeaseLost, MemorySessionStore,
                              PendingTurn, RecordTooLarge, RedisSessionStore, SessionExists,
                              SessionNotFound, SessionStore, StoreUnavailable, TakeoverRequested, Turn,
                              VersionConflict, events_key, lease_key, new_record, open_store,
                              session_key)
from gateway.sessions import memory as memory_store
from tests.kit.ports import free_port
from tests.kit.redis_server import RedisServer

POLL_S = 0.05
SHORT_TTL_S = 0.3  # for leases and sessions that must expire during a test
EXPIRY_DEADLINE_S = 5.0  # generous: the machine may be busy
UNAVAILABLE_DEADLINE_S = 5.0  # a dead Redis must raise well within this, never hang


StoreFactory = Callable[..., SessionStore]


@pytest.fixture(params=["memory", "redis"])
async def make_store(request) -> AsyncIterator[StoreFactory]:
    """Makes stores of one backend; every store made in one test shares the same data."""
    stores: list[SessionStore] = []
    memory_data = MemorySessionStore()
    server = request.getfixturevalue("redis_server") if request.param == "redis" else None

    def make(session_ttl_s: float = 60.0) -> SessionStore:
        if server is not None:
            store: SessionStore = RedisSessionStore(server.url, session_ttl_s)
        else:
            store = MemorySessionStore(session_ttl_s)
            store._entries, store._leases = memory_data._entries, memory_data._leases
            store._takeovers, store._takeover_queues = memory_data._takeovers, memory_data._takeover_queues
        stores.append(store)
        return store

    yield make
    for store in stores:
        await store.close()


async def eventually(check: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = time.monotonic() + EXPIRY_DEADLINE_S
    while not await check():
        assert time.monotonic() < deadline, f"{what} did not happen within {EXPIRY_DEADLINE_S} s"
        await asyncio.sleep(POLL_S)


def event(seq: int) -> str:
    return json.dumps({"type": "transcript.partial", "seq": seq, "t": 1.0, "text": f"w{seq}"})


async def test_create_get_update_round_trip(make_store: StoreFactory) -> None:
    store = make_store()
    created = await store.create("s1", {"voice": "en-1", "on_resume": "continue"})
    assert created.version == 0 and created.history == [] and created.in_progress is None

    record = await store.get("s1")
    assert record == created
    record.history += [Turn("user", "hello"), Turn("assistant", "hi there, how", heard_text="hi there")]
    record.in_progress = PendingTurn("Let me check that for you.", played_ms=640)
    record.last_event_seq = 17
    updated = await store.update(record)
    assert updated.version == 1 and updated.updated_at >= created.updated_at

    again = await store.get("s1")
    assert again == updated
    assert again.history[1].heard_text == "hi there"
    assert again.in_progress == PendingTurn("Let me check that for you.", 640)
    assert again.settings == {"voice": "en-1", "on_resume": "continue"}


async def test_create_twice_and_missing_sessions(make_store: StoreFactory) -> None:
    store = make_store()
    await store.create("s1")
    with pytest.raises(SessionExists):
        await store.create("s1")
    with pytest.raises(SessionNotFound):
        await store.get("nope")
    with pytest.raises(SessionNotFound):
        await store.append_event("nope", event(1))
    with pytest.raises(SessionNotFound):
        await store.events_since("nope", 0)
    ghost = await store.get("s1")
    ghost.session_id = "nope"
    with pytest.raises(SessionNotFound):
        await store.update(ghost)


async def test_stale_update_is_a_version_conflict(make_store: StoreFactory) -> None:
    node_a, node_b = make_store(), make_store()
    await node_a.create("s1")
    seen_by_a, seen_by_b = await node_a.get("s1"), await node_b.get("s1")
    seen_by_a.last_event_seq = 5
    await node_a.update(seen_by_a)
    seen_by_b.last_event_seq = 9
    with pytest.raises(VersionConflict):
        await node_b.update(seen_by_b)
    assert (await node_b.get("s1")).last_event_seq == 5


async def test_concurrent_updates_exactly_one_wins(make_store: StoreFactory) -> None:
    node_a, node_b = make_store(), make_store()
    await node_a.create("s1")
    records = [await node_a.get("s1"), await node_b.get("s1")]
    for seq, record in enumerate(records, 1):
        record.last_event_seq = seq
    results = await asyncio.gather(node_a.update(records[0]), node_b.update(records[1]),
                                   return_exceptions=True)
    assert sorted(type(r).__name__ for r in results) == ["SessionRecord", "VersionConflict"]
    winner = next(r for r in results if not isinstance(r, Exception))
    assert await node_a.get("s1") == winner and winner.version == 1


async def test_event_log_is_bounded_and_replays_exactly_the_missed(make_store: StoreFactory) -> None:
    store = make_store()
    await store.create("s1")
    total = MAX_REPLAY_EVENTS + 44
    for seq in range(1, total + 1):
        await store.append_event("s1", event(seq))

    missed = await store.events_since("s1", total - 3)
    assert [json.loads(e)["seq"] for e in missed] == [total - 2, total - 1, total]
    assert missed[-1] == event(total)
    assert await store.events_since("s1", total) == []

    kept = await store.events_since("s1", 0)
    assert len(kept) == MAX_REPLAY_EVENTS
    assert json.loads(kept[0])["seq"] == total - MAX_REPLAY_EVENTS + 1  # older ones fell out

    with pytest.raises(ValueError):
        await store.append_event("s1", json.dumps({"type": "x"}))


async def test_lease_excludes_other_nodes_until_released(make_store: StoreFactory) -> None:
    store = make_store()
    await store.create("s1")
    expiry = await store.acquire_lease("s1", "node-a", ttl_s=30)
    assert expiry > time.time()
    record = await store.get("s1")
    assert record.owner_node == "node-a" and record.lease_expires_at > time.time()

    with pytest.raises(LeaseHeld):
        await store.acquire_lease("s1", "node-b", ttl_s=30)
    await store.acquire_lease("s1", "node-a", ttl_s=30)  # the holder may take it again
    assert await store.release_lease("s1", "node-b") is False  # not the holder
    with pytest.raises(LeaseHeld):
        await store.acquire_lease("s1", "node-b", ttl_s=30)

    assert await store.release_lease("s1", "node-a") is True
    assert (await store.get("s1")).owner_node is None
    await store.acquire_lease("s1", "node-b", ttl_s=30)
    assert (await store.get("s1")).owner_node == "node-b"


async def test_lease_can_be_taken_after_it_expires(make_store: StoreFactory) -> None:
    store = make_store()
    await store.create("s1")
    await store.acquire_lease("s1", "node-a", ttl_s=SHORT_TTL_S)

    async def node_b_acquires() -> bool:
        try:
            await store.acquire_lease("s1", "node-b", ttl_s=30)
        except LeaseHeld:
            return False
        return True

    await eventually(node_b_acquires, "the expired lease being taken by node-b")
    with pytest.raises(LeaseLost):
        await store.renew_lease("s1", "node-a", ttl_s=30)  # node-a lost it
    assert (await store.get("s1")).owner_node == "node-b"


async def test_takeover_request_makes_the_holders_renewal_fail(make_store: StoreFactory) -> None:
    store = make_store()
    await store.create("s1")
    await store.acquire_lease("s1", "node-a", ttl_s=30)
    await store.renew_lease("s1", "node-a", ttl_s=30)
    await store.request_takeover("s1", "node-b", ttl_s=30)
    with pytest.raises(LeaseHeld):
        await store.acquire_lease("s1", "node-b", ttl_s=30)  # asked, not yet given up
    with pytest.raises(TakeoverRequested):
        await store.renew_lease("s1", "node-a", ttl_s=30)  # node-a learns it must let go...
    with pytest.raises(LeaseHeld):
        await store.acquire_lease("s1", "node-b", ttl_s=30)  # ...and may write what is pending first
    assert await store.release_lease("s1", "node-a")
    await store.acquire_lease("s1", "node-b", ttl_s=30)
    await store.renew_lease("s1", "node-b", ttl_s=30)  # the request was consumed by node-b
    assert (await store.get("s1")).owner_node == "node-b"


async def test_the_holder_is_told_of_a_takeover_request_at_once(make_store: StoreFactory) -> None:
    holder, asker = make_store(), make_store()
    await holder.create("s1")
    await holder.acquire_lease("s1", "node-a", ttl_s=30)
    requests = holder.takeover_requests("node-a")
    first = asyncio.ensure_future(requests.__anext__())
    await asyncio.sleep(0.2)  # let the subscription reach the store before publishing
    await asker.request_takeover("s1", "node-b", ttl_s=30)
    assert await asyncio.wait_for(first, EXPIRY_DEADLINE_S) == "s1"
    await requests.aclose()


async def test_put_stores_unconditionally_and_restores_the_event_log(make_store: StoreFactory) -> None:
    store = make_store()
    record = new_record("s1", {"voice": "en-1"})
    record.history.append(Turn("user", "hello"))
    record.last_event_seq = 7
    await store.put(record, [event(5), event(7)])  # creates it
    assert (await store.get("s1")).history == [Turn("user", "hello")]
    assert [json.loads(e)["seq"] for e in await store.events_since("s1", 0)] == [5, 7]
    record.history.append(Turn("assistant", "hi", heard_text="hi"))
    await store.put(record)  # overwrites the record, keeps the log
    await store.append_event("s1", event(8))
    stored = await store.get("s1")
    assert stored.history[-1].heard_text == "hi" and stored.last_event_seq == 7
    assert [json.loads(e)["seq"] for e in await store.events_since("s1", 6)] == [7, 8]
    await store.ping()


async def test_only_the_owner_renews(make_store: StoreFactory) -> None:
    store = make_store()
    await store.create("s1")
    with pytest.raises(LeaseLost):
        await store.renew_lease("s1", "node-a", ttl_s=30)  # nobody holds it yet
    first = await store.acquire_lease("s1", "node-a", ttl_s=5)
    with pytest.raises(LeaseLost):
        await store.renew_lease("s1", "node-b", ttl_s=30)
    renewed = await store.renew_lease("s1", "node-a", ttl_s=30)
    assert renewed > first
    assert (await store.get("s1")).lease_expires_at > first


async def test_session_expires_after_its_ttl(make_store: StoreFactory) -> None:
    store = make_store(session_ttl_s=SHORT_TTL_S)
    await store.create("s1")
    await store.append_event("s1", event(1))

    async def gone() -> bool:
        try:
            await store.get("s1")
        except SessionNotFound:
            return True
        return False

    await eventually(gone, "the session expiring")
    with pytest.raises(SessionNotFound):
        await store.events_since("s1", 0)
    await store.create("s1")  # the id is free again


@pytest.mark.parametrize("made_by", ["create", "put"])
async def test_the_memory_store_forgets_expired_sessions_nobody_asks_for(monkeypatch, made_by: str) -> None:
    # Redis drops expired keys by itself; checked on access alone, every session a node ever
    # had stayed in its memory (an 8-call soak grew ~45 MB in 30 minutes so). The gateway's
    # keeper makes its sessions with put(), not create(): a sweep on create alone never ran
    # in a serving node (its RSS rose ~6 KiB a call through a 30-minute soak).
    monkeypatch.setattr(memory_store, "SWEEP_EVERY_S", 0.0)
    store = MemorySessionStore(SHORT_TTL_S)

    async def make(session_id: str) -> None:
        if made_by == "create":
            await store.create(session_id)
        else:
            await store.put(new_record(session_id, None))

    for k in range(50):
        await make(f"old{k}")
        await store.append_event(f"old{k}", event(1))
        await store.acquire_lease(f"old{k}", "node-a", SHORT_TTL_S)
    made = iter(range(1000))

    async def only_new_ones_left() -> bool:
        await make(f"new{next(made)}")  # (a new call: what sweeps)
        return not any(k.startswith("old") for k in [*store._entries, *store._leases])

    await eventually(only_new_ones_left, "the expired sessions being forgotten")


async def test_delete_removes_record_events_and_lease(make_store: StoreFactory) -> None:
    store = make_store()
    await store.create("s1")
    await store.append_event("s1", event(1))
    await store.acquire_lease("s1", "node-a", ttl_s=30)
    assert await store.delete("s1") is True
    assert await store.delete("s1") is False
    with pytest.raises(SessionNotFound):
        await store.get("s1")
    await store.create("s1")
    assert await store.events_since("s1", 0) == []
    await store.acquire_lease("s1", "node-b", ttl_s=30)  # the old lease went with it


async def test_records_stay_small_and_hold_no_resume_token(make_store: StoreFactory) -> None:
    store = make_store()
    with pytest.raises(ValueError):
        await store.create("s1", {"resume_token": "secret"})
    record = await store.create("s2")
    record.history = [Turn("user", "x" * 1000) for _ in range(100)]
    with pytest.raises(RecordTooLarge):
        await store.update(record)
    assert (await store.get("s2")).version == 0


async def test_redis_keys_are_namespaced_and_all_have_ttls(redis_server: RedisServer) -> None:
    store = RedisSessionStore(redis_server.url, session_ttl_s=600)
    try:
        await store.create("s1", {"voice": "en-1"})
        await store.append_event("s1", event(1))
        await store.acquire_lease("s1", "node-a", ttl_s=30)
        keys = sorted(redis_server.client.keys("*"))
        assert keys == sorted([session_key("s1"), events_key("s1"), lease_key("s1")])
        assert keys == ["parley:events:s1", "parley:lease:s1", "parley:session:s1"]
        for key in keys:
            assert 0 < redis_server.client.pttl(key), f"{key} has no TTL"
        assert redis_server.client.pttl(session_key("s1")) > 30_000  # session TTL, not the lease's
        assert "resume_token" not in redis_server.client.get(session_key("s1"))
        assert "owner_node" not in redis_server.client.get(session_key("s1"))  # the lease key owns that
        assert await store.delete("s1")
        assert redis_server.client.keys("*") == []
    finally:
        await store.close()


async def test_redis_going_away_raises_store_unavailable(redis_server: RedisServer) -> None:
    store = RedisSessionStore(redis_server.url, session_ttl_s=600)
    try:
        await store.create("s1")
        redis_server.stop()
        for operation in (store.get("s1"), store.append_event("s1", event(1)),
                          store.acquire_lease("s1", "node-a", 30)):
            with pytest.raises(StoreUnavailable) as caught:
                await asyncio.wait_for(operation, UNAVAILABLE_DEADLINE_S)
            assert isinstance(caught.value.__cause__, redis.ConnectionError)
            assert redis_server.url in str(caught.value)
    finally:
        await store.close()


async def test_unreachable_redis_fails_fast() -> None:
    store = RedisSessionStore(f"redis://127.0.0.1:{free_port()}/0")
    try:
        with pytest.raises(StoreUnavailable):
            await asyncio.wait_for(store.create("s1"), UNAVAILABLE_DEADLINE_S)
    finally:
        await store.close()


async def test_open_store_picks_the_backend() -> None:
    assert isinstance(open_store(None), MemorySessionStore)
    assert isinstance(open_store(""), MemorySessionStore)
    redis_store = open_store("redis://127.0.0.1:1/0", session_ttl_s=5)
    assert isinstance(redis_store, RedisSessionStore) and redis_store.session_ttl_s == 5
    await redis_store.close()

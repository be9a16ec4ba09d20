"""SessionKeeper write-behind: every change reaches the store, even one made while a write is on the wire."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Optional

import pytest

from gateway.keeper import SessionKeeper
from gateway.sessions import MemorySessionStore, SessionRecord, StoreUnavailable

DEADLINE_S = 5.0


class GatedStore(MemorySessionStore):
    """A store whose record writes wait at a gate once encoded, as a slow Redis round trip does."""

    def __init__(self) -> None:
        super().__init__()
        self.gate: Optional[asyncio.Event] = None
        self.writing = asyncio.Event()

    async def put(self, record: SessionRecord, events: Optional[list[str]] = None) -> None:
        if self.gate is None:
            return await super().put(record, events)
        snapshot = SessionRecord(**{**record.__dict__, "history": list(record.history)})
        self.writing.set()
        await self.gate.wait()
        await super().put(snapshot, events)


class BrokenAppendStore(MemorySessionStore):
    """A store whose event appends fail with an error the keeper has no name for."""

    failures = 0

    async def append_event(self, session_id: str, event_json: str) -> None:
        if self.failures == 0:
            self.failures += 1
            raise RuntimeError("a bug in a store")
        await super().append_event(session_id, event_json)


class UnreachableStore(MemorySessionStore):
    """Redis gone: a lease cannot be taken."""

    async def acquire_lease(self, session_id: str, node_id: str, ttl_s: float) -> float:
        raise StoreUnavailable("connection refused")


def event(seq: int) -> tuple[dict, str]:
    body = {"type": "error", "seq": seq, "code": "bad_message"}
    return body, json.dumps(body)


async def stored_seq(store: MemorySessionStore, session_id: str) -> int:
    return (await store.get(session_id)).last_event_seq


async def test_a_change_made_while_its_record_is_being_written_is_written_too() -> None:
    store = GatedStore()
    keeper = SessionKeeper(store, "node-a", lease_ttl_s=30.0)
    keeper.start()
    try:
        await keeper.open_new("s1")
        store.gate = asyncio.Event()
        keeper.record_event("s1", *event(1))
        await asyncio.wait_for(store.writing.wait(), DEADLINE_S)  # seq 1 encoded, not yet stored
        keeper.record_event("s1", *event(2))  # the change the write on the wire does not carry
        store.gate.set()
        assert await keeper.flush(timeout_s=DEADLINE_S, session_id="s1")
        assert await stored_seq(store, "s1") == 2
    finally:
        await keeper.stop()


async def test_an_unexpected_store_error_is_logged_and_later_writes_go_on(caplog) -> None:
    store = BrokenAppendStore()
    keeper = SessionKeeper(store, "node-a", lease_ttl_s=30.0)
    keeper.start()
    try:
        await keeper.open_new("s1")
        keeper.record_event("s1", *event(1))  # its append fails
        assert await keeper.flush(timeout_s=DEADLINE_S, session_id="s1")
        keeper.record_event("s1", *event(2))
        assert await keeper.flush(timeout_s=DEADLINE_S, session_id="s1")
        assert await stored_seq(store, "s1") == 2
        assert [seq for seq, _ in store._entries["s1"].events] == [2]
        failed = [r for r in caplog.records if r.levelno == logging.ERROR and "write-behind" in r.getMessage()]
        assert len(failed) == 1 and failed[0].exc_info is not None
    finally:
        await keeper.stop()


async def test_an_ended_sessions_copy_is_kept_as_long_as_the_store_keeps_it_and_no_longer(monkeypatch) -> None:
    store = MemorySessionStore(session_ttl_s=60.0)
    keeper = SessionKeeper(store, "node-a", lease_ttl_s=30.0, session_ttl_s=60.0)
    keeper.start()
    try:
        clock = [1000.0]
        monkeypatch.setattr("gateway.keeper.time.monotonic", lambda: clock[0])
        for session_id in ("early", "late"):
            await keeper.open_new(session_id)
            await keeper.end(session_id)
            clock[0] += 30.0
        assert list(keeper.recent) == ["early", "late"]  # 60 and 30 s since they ended
        clock[0] += 1.0
        await keeper.open_new("next")
        await keeper.end("next")
        assert list(keeper.recent) == ["late", "next"]  # "early" ended 61 s ago: the store forgot it too
        clock[0] += 60.0
        keeper.store = UnreachableStore()  # an outage: no resume from a copy kept past the TTL
        with pytest.raises(StoreUnavailable):
            await keeper.resume("late")
        assert not keeper.recent
    finally:
        keeper.store = store
        await keeper.stop()

"""Sessions that survive: reconnect with a resume token on the same node or another, event
replay, dead-peer detection, leases between nodes, Redis outages, drain redirects.
Real aiortc peers, real gateways and (where named) a real redis-server."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Awaitable, Callable, Union

from gateway.sessions import lease_key, session_key, events_key
from tests.kit.peer import QUIET, Caller

DEADLINE_S = 30.0  # generous: the machine may be busy
POLL_S = 0.05
SECRET = "test-secret-shared-by-every-node"
LEASE_TTL_S = 1.5  # short, so takeovers and expiries happen within a test


async def wait_until(check: Callable[[], Union[bool, Awaitable[bool]]], what: str,
                     timeout: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout} s"
        await asyncio.sleep(POLL_S)


async def connect(url: str, http, **resume) -> Caller:
    caller = Caller(url, light=True, packets=QUIET)
    await caller.call(http, **resume)
    await caller.wait_for_event("session.ready", DEADLINE_S)
    return caller


async def provoke_error_event(caller: Caller) -> dict:
    """A logged (replayable) event: the gateway answers a bad client message with `error`."""
    before = len([e for e in caller.events if e["type"] == "error"])
    caller.channel.send("this is not JSON")
    await wait_until(lambda: len([e for e in caller.events if e["type"] == "error"]) > before, "an error event")
    return [e for e in caller.events if e["type"] == "error"][-1]


def redis_nodes(start_gateway, redis_server, **settings):
    common = dict(redis_url=redis_server.url, secret=SECRET, lease_ttl_s=LEASE_TTL_S, **settings)
    return (start_gateway(node_id="node-a", **common), start_gateway(node_id="node-b", **common))


async def test_same_node_reconnect_replays_missed_events_and_continues_numbering(start_gateway, http):
    gateway = await start_gateway()
    first = await connect(gateway.url, http)
    ready = await first.wait_for_event("session.ready")
    assert ready["resumed"] is False
    missed = await provoke_error_event(first)
    await first.close()  # the connection drops; the client saw events up to session.ready only
    await wait_until(lambda: not gateway.registry.by_session, "the dropped call closing")

    second = await connect(gateway.url, http, resume_token=first.response["resume_token"], last_seq=ready["seq"])
    assert second.response["resumed"] is True
    assert second.response["session_id"] == first.response["session_id"]
    resumed_ready = await second.wait_for_event("session.ready")
    assert resumed_ready["resumed"] is True and resumed_ready["session_id"] == first.response["session_id"]
    assert resumed_ready["seq"] > max(first.seqs()), "numbering continues after the old call's last event"
    replayed = [e for e in second.events if e["seq"] < resumed_ready["seq"]]
    assert missed in replayed, "the missed error event is replayed with its original seq"
    assert all(e["seq"] > ready["seq"] for e in second.events), "nothing the client already had is replayed"
    assert len(second.seqs()) == len(set(second.seqs())), "no event twice"
    await second.hang_up(http)


async def test_resume_replaces_a_call_the_node_still_thinks_alive(start_gateway, http):
    gateway = await start_gateway()
    first = await connect(gateway.url, http)
    old_call = gateway.registry.by_session[first.response["session_id"]]
    second = await connect(gateway.url, http, resume_token=first.response["resume_token"])
    await asyncio.wait_for(old_call.closed.wait(), DEADLINE_S)
    assert old_call.close_reason == "replaced"
    assert list(gateway.registry.by_session) == [first.response["session_id"]]
    assert gateway.registry.by_session[first.response["session_id"]].call_id == second.response["call_id"]
    await second.wait_connected(DEADLINE_S)
    await first.close()
    await second.close()
    await wait_until(lambda: not gateway.registry.by_session, "the second call closing")
    third = await connect(gateway.url, http, resume_token=first.response["resume_token"], last_seq=0)
    replayed = {e["type"] for e in third.events if e["seq"] < third.events[-1]["seq"]}
    assert not replayed & {"session.ended", "session.migrate", "call.stats", "pong"}, \
        "events about an ended connection are never replayed to a new one"
    await third.hang_up(http)


async def test_a_silent_peer_is_closed_quickly_and_can_resume(start_gateway, http):
    gateway = await start_gateway(peer_timeout_s=1.0)
    caller = await connect(gateway.url, http)
    await caller.wait_connected(DEADLINE_S)
    call = gateway.registry.by_session[caller.response["session_id"]]
    caller.track.stop()  # no more RTP, and the client sends nothing on the data channel
    await asyncio.wait_for(call.closed.wait(), DEADLINE_S)
    assert call.close_reason == "peer_timeout"
    again = await connect(gateway.url, http, resume_token=caller.response["resume_token"])
    assert again.response["session_id"] == caller.response["session_id"]
    await caller.close()
    await again.hang_up(http)


async def test_a_token_resumes_its_own_session_only(start_gateway, http):
    gateway = await start_gateway()
    alice = await connect(gateway.url, http)
    bob = await connect(gateway.url, http)
    bob_call = gateway.registry.by_session[bob.response["session_id"]]
    await alice.close()
    again = await connect(gateway.url, http, resume_token=alice.response["resume_token"])
    assert again.response["session_id"] == alice.response["session_id"] != bob.response["session_id"]
    assert gateway.registry.by_session[bob.response["session_id"]] is bob_call and not bob_call.closed.is_set()
    other_deployment = await start_gateway()  # another secret: its tokens mean nothing here
    body = {"sdp": "v=0", "type": "offer", "resume_token": alice.response["resume_token"]}
    async with http.post(other_deployment.url + "/v1/calls", json=body) as response:
        assert response.status == 401
        assert (await response.json())["error"]["code"] == "invalid_resume_token"
    await bob.hang_up(http)
    await again.hang_up(http)


async def test_resume_on_another_node_takes_the_session_over(start_gateway, http, redis_server):
    node_a, node_b = await asyncio.gather(*redis_nodes(start_gateway, redis_server))
    first = await connect(node_a.url, http)
    session_id = first.response["session_id"]
    missed = await provoke_error_event(first)
    old_call = node_a.registry.by_session[session_id]

    # The caller moved networks and reached node B while node A still drives the session.
    second = await connect(node_b.url, http, resume_token=first.response["resume_token"], last_seq=0)
    await asyncio.wait_for(old_call.closed.wait(), DEADLINE_S)
    assert old_call.close_reason == "taken_over"
    assert session_id in node_b.registry.by_session and session_id not in node_a.registry.by_session
    assert redis_server.client.get(lease_key(session_id)) == "node-b"
    assert missed in second.events, "events logged by node A are replayed by node B"
    ready = [e for e in second.events if e["type"] == "session.ready"]
    assert [e["resumed"] for e in ready] == [False, True] and ready[1]["seq"] > missed["seq"]
    await second.wait_connected(DEADLINE_S)
    await first.close()
    await second.hang_up(http)


async def test_two_nodes_racing_for_one_session_end_with_one_driver(start_gateway, http, redis_server):
    node_a, node_b = await asyncio.gather(*redis_nodes(start_gateway, redis_server))
    first = await connect(node_a.url, http)
    session_id, token = first.response["session_id"], first.response["resume_token"]
    racers = [Caller(node.url, light=True, packets=QUIET) for node in (node_a, node_b)]
    outcomes = await asyncio.gather(*(racer.call(http, resume_token=token) for racer in racers),
                                    return_exceptions=True)
    assert any(isinstance(outcome, dict) for outcome in outcomes), outcomes
    for outcome in outcomes:  # a loser may be told the session is busy, nothing worse
        assert isinstance(outcome, dict) or "409" in str(outcome), outcome

    def drivers() -> list[str]:
        return [node.registry.config.node_id for node in (node_a, node_b) if session_id in node.registry.by_session]

    await wait_until(lambda: len(drivers()) == 1 and redis_server.client.get(lease_key(session_id)) == drivers()[0],
                     "exactly one node driving the session, holding its lease")
    await asyncio.sleep(3 * LEASE_TTL_S)  # several renewals later, still exactly one
    assert len(drivers()) == 1 and redis_server.client.get(lease_key(session_id)) == drivers()[0]
    for caller in [first, *racers]:
        await caller.close()


async def test_calls_go_on_while_redis_is_down_and_nothing_is_lost(start_gateway, http, redis_server, caplog):
    caplog.set_level(logging.INFO, logger="parley.sessions")
    gateway = await start_gateway(redis_url=redis_server.url, secret=SECRET, lease_ttl_s=LEASE_TTL_S)
    keeper = gateway.registry.keeper
    caller = await connect(gateway.url, http)
    session_id = caller.response["session_id"]
    redis_server.stop()
    await wait_until(lambda: not keeper.available, "the keeper noticing the outage")

    during = await provoke_error_event(caller)  # the call keeps working: events still flow
    packets = caller.counter.packets
    await wait_until(lambda: caller.counter.packets > packets + 25, "audio still flowing")
    newcomer = await connect(gateway.url, http)  # embedded default: new calls are accepted
    assert gateway.registry.by_session[session_id].close_reason is None

    redis_server.start()  # back, and empty
    await wait_until(lambda: keeper.available, "the keeper noticing Redis is back")
    for sid in (session_id, newcomer.response["session_id"]):
        await wait_until(lambda: redis_server.client.exists(session_key(sid)), f"session {sid} restored")
        assert redis_server.client.get(lease_key(sid)) == gateway.registry.config.node_id
    record = json.loads(redis_server.client.get(session_key(session_id)))
    assert record["last_event_seq"] >= during["seq"]
    logged = [json.loads(text) for text in redis_server.client.lrange(events_key(session_id), 0, -1)]
    assert during in logged, "the event sent during the outage was written once Redis returned"
    messages = [r.getMessage() for r in caplog.records if r.name == "parley.sessions"]
    assert messages.count("session store unavailable; live calls go on, writes are queued") == 1
    assert messages.count("session store is back; live sessions restored") == 1
    await caller.hang_up(http)
    await newcomer.hang_up(http)


async def test_new_calls_follow_config_while_redis_is_unreachable(start_gateway, http, redis_server):
    redis_server.stop()
    strict = await start_gateway(redis_url=redis_server.url, new_calls_without_redis="reject")
    caller = Caller(strict.url, light=True, packets=QUIET)
    await caller.pc.setLocalDescription(await caller.pc.createOffer())
    body = {"sdp": caller.pc.localDescription.sdp, "type": "offer"}
    async with http.post(strict.url + "/v1/calls", json=body) as response:
        assert response.status == 503 and response.headers["Retry-After"]
        assert (await response.json())["error"]["code"] == "store_unavailable"
    assert strict.registry.active == 0
    await caller.close()
    lenient = await start_gateway(redis_url=redis_server.url)
    accepted = await connect(lenient.url, http)
    await accepted.hang_up(http)


async def test_a_draining_node_redirects_new_calls_to_a_ready_peer(start_gateway, http, redis_server):
    node_a, node_b = await asyncio.gather(*redis_nodes(start_gateway, redis_server))
    for node in (node_a, node_b):
        node.registry.config.public_url = node.url

    async def b_is_listed() -> bool:
        return any(n.node_id == "node-b" and n.can_take_calls for n in await node_a.registry.nodes.nodes())

    await wait_until(b_is_listed, "node B's heartbeat")
    node_a.registry.start_drain(60.0)
    body = {"sdp": "v=0", "type": "offer"}
    async with http.post(node_a.url + "/v1/calls", json=body, allow_redirects=False) as response:
        assert response.status == 307
        assert response.headers["Location"] == node_b.url + "/v1/calls"
    caller = Caller(node_a.url, light=True, packets=QUIET)  # a client that follows the redirect lands on B
    await caller.call(http)
    assert node_b.registry.active == 1 and node_a.registry.active == 0
    node_b.registry.start_drain(60.0)
    async with http.post(node_a.url + "/v1/calls", json=body, allow_redirects=False) as response:
        assert response.status == 503, "no ready peer left"
        assert (await response.json())["error"]["code"] == "draining"
    await caller.close()


async def test_numbering_never_repeats_what_the_client_already_saw(start_gateway, http):
    """A node that died before writing its last events behind: the client's last_seq wins."""
    gateway = await start_gateway()
    first = await connect(gateway.url, http)
    await first.close()
    await wait_until(lambda: not gateway.registry.by_session, "the dropped call closing")
    second = await connect(gateway.url, http, resume_token=first.response["resume_token"], last_seq=1000)
    assert (await second.wait_for_event("session.ready"))["seq"] == 1001
    await second.hang_up(http)


async def test_bad_last_seq_is_a_clear_400(start_gateway, http):
    gateway = await start_gateway()
    for last_seq in (-1, "7", 1.5, True):
        body = {"sdp": "v=0", "type": "offer", "last_seq": last_seq}
        async with http.post(gateway.url + "/v1/calls", json=body) as response:
            assert response.status == 400
            assert (await response.json())["error"]["code"] == "invalid_last_seq"
    assert gateway.registry.active == 0

"""Two real gateway processes sharing a real redis-server: a caller survives its node being
killed (SIGKILL) or drained (SIGTERM) by resuming on the other node."""

from __future__ import annotations

import asyncio
import signal

from gateway.sessions import events_key, lease_key
from tests.kit.ports import free_port
from tests.kit.peer import Caller
from tests.kit.processes import DEADLINE_S, kill, start_server, wait_ready
from tests.test_resume import QUIET, SECRET, connect, provoke_error_event, wait_until

LEASE_TTL_S = "1.5"


async def start_node(redis_url: str, node_id: str, *flags: str) -> tuple[asyncio.subprocess.Process, str]:
    port = free_port()
    env = {"PARLEY_REDIS_URL": redis_url, "PARLEY_SECRET": SECRET, "PARLEY_LEASE_TTL_S": LEASE_TTL_S,
           "PARLEY_NODE_ID": node_id, "PARLEY_PUBLIC_URL": f"http://127.0.0.1:{port}"}
    proc, url = await start_server("--port", str(port), *flags, env=env)
    return proc, url


async def test_a_caller_resumes_on_another_node_after_its_node_is_killed(http, redis_server):
    (node_a, url_a), (node_b, url_b) = await asyncio.gather(
        start_node(redis_server.url, "node-a"), start_node(redis_server.url, "node-b"))
    try:
        await asyncio.gather(wait_ready(http, url_a), wait_ready(http, url_b))
        caller = await connect(url_a, http)
        session_id = caller.response["session_id"]
        seen = await caller.wait_for_event("session.ready")
        missed = await provoke_error_event(caller)
        await wait_until(lambda: redis_server.client.get(lease_key(session_id)) == "node-a", "node A's lease")
        await wait_until(lambda: redis_server.client.llen(events_key(session_id)) >= 2, "A's writes behind")
        node_a.kill()  # no drain, no goodbye
        await node_a.wait()

        resumed = await connect(url_b, http, resume_token=caller.response["resume_token"], last_seq=seen["seq"])
        assert resumed.response["session_id"] == session_id and resumed.response["resumed"] is True
        ready = [e for e in resumed.events if e["type"] == "session.ready"][-1]
        assert ready["resumed"] is True and ready["seq"] > missed["seq"]
        assert missed in resumed.events, "the event node A sent before dying is replayed by node B"
        assert len(resumed.seqs()) == len(set(resumed.seqs()))
        await resumed.wait_connected(DEADLINE_S)
        await wait_until(lambda: resumed.counter.packets > 25, "audio from node B")
        assert redis_server.client.get(lease_key(session_id)) == "node-b"
        await caller.close()
        await resumed.hang_up(http)
    finally:
        await kill(node_a)
        await kill(node_b)


async def test_a_drained_node_sends_callers_to_its_peer(http, redis_server):
    (node_a, url_a), (node_b, url_b) = await asyncio.gather(
        start_node(redis_server.url, "node-a", "--drain-timeout-s", "1"), start_node(redis_server.url, "node-b"))
    try:
        await asyncio.gather(wait_ready(http, url_a), wait_ready(http, url_b))
        caller = await connect(url_a, http)
        await caller.wait_connected(DEADLINE_S)
        node_a.send_signal(signal.SIGTERM)
        migrate = await caller.wait_for_event("session.migrate", DEADLINE_S)

        async def redirected() -> bool:  # new callers go to the ready peer while A drains
            async with http.post(url_a + "/v1/calls", json={"sdp": "v=0", "type": "offer"},
                                 allow_redirects=False) as response:
                return response.status == 307 and response.headers["Location"] == url_b + "/v1/calls"

        if node_a.returncode is None:
            try:
                await wait_until(redirected, "a 307 to node B", timeout=5.0)
            except Exception:  # A may already have exited after migrating its last call
                assert node_a.returncode is not None
        moved = await connect(url_b, http, resume_token=migrate["resume_token"])
        assert moved.response["session_id"] == caller.response["session_id"]
        assert await asyncio.wait_for(node_a.wait(), DEADLINE_S) == 0
        await moved.wait_connected(DEADLINE_S)
        await caller.close()
        await moved.hang_up(http)
    finally:
        await kill(node_a)
        await kill(node_b)


async def test_a_reply_cut_off_by_a_dead_node_continues_on_the_other(http, redis_server, tmp_path):
    """Conversation mode, two processes: node A dies (SIGKILL) while greeting the caller; the
    caller resumes on node B, which speaks the rest of the greeting from the first word the
    caller had not heard, and the session's history records it once, heard in full."""
    import json

    import torch

    from engine import weights
    from engine.tts import TtsConfig, TtsModel
    from gateway.sessions import session_key

    torch.manual_seed(0)
    tts = TtsModel(TtsConfig(width=64, encoder_depth=1))
    with torch.no_grad():  # slow speech, so the greeting is still playing when node A dies
        tts.duration_head[-1].bias.fill_(2.0)
    tts_weights = tmp_path / "tts.safetensors"
    weights.save(tts, tts.config_dict(), tts_weights)
    flags = ("--mode", "conversation", "--tts-weights", str(tts_weights), "--engine-threads", "1")
    (node_a, url_a), (node_b, url_b) = await asyncio.gather(
        start_node(redis_server.url, "node-a", *flags), start_node(redis_server.url, "node-b", *flags))
    try:
        await asyncio.gather(wait_ready(http, url_a), wait_ready(http, url_b))
        caller = await connect(url_a, http)
        session_id = caller.response["session_id"]
        await caller.wait_for_event("response.audio.start", DEADLINE_S)

        def progress() -> dict:
            raw = redis_server.client.get(session_key(session_id))
            return (json.loads(raw) if raw else {}).get("in_progress") or {}

        await wait_until(lambda: len(progress().get("heard_text", "").split()) >= 2, "A's progress in Redis")
        pending = progress()
        node_a.kill()
        await node_a.wait()

        resumed = await connect(url_b, http, resume_token=caller.response["resume_token"],
                                last_seq=max(caller.seqs()))
        event = await resumed.wait_for_event("response.resumed", DEADLINE_S)
        assert 2 <= event["from_word"] < len(pending["text"].split())
        await resumed.wait_for_event("response.audio.end", DEADLINE_S)
        await wait_until(lambda: not progress(), "the finished reply leaving in_progress")
        history = json.loads(redis_server.client.get(session_key(session_id)))["history"]
        assert history == [{"role": "assistant", "text": pending["text"], "heard_text": pending["text"]}]
        assert not [e for e in resumed.events if e["type"] == "response.text.delta"], "no second greeting"
        await caller.close()
        await resumed.hang_up(http)
    finally:
        await kill(node_a)
        await kill(node_b)

"""Signaling API: contracts, and bad input that must get a clear error and change nothing."""

import asyncio
import gc
import json
import re
import warnings

import pytest
from aiortc import RTCConfiguration, RTCPeerConnection

from gateway import tokens


@pytest.fixture
async def offer_sdp():
    """A real browser-shaped offer (audio sendrecv + data channel), never answered."""
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTransceiver("audio", direction="sendrecv")
    pc.createDataChannel("events")
    await pc.setLocalDescription(await pc.createOffer())
    yield pc.localDescription.sdp
    await pc.close()


async def post_json(http, url, payload, **kwargs):
    async with http.post(url + "/v1/calls", data=payload, **kwargs) as response:
        return response.status, await response.json(), response.headers


def assert_error(body, code):
    assert set(body) == {"error"} and body["error"]["code"] == code and body["error"]["message"]


async def test_health_endpoints(start_gateway, http):
    gateway = await start_gateway()
    async with http.get(gateway.url + "/livez") as response:
        assert response.status == 200
    async with http.get(gateway.url + "/readyz") as response:
        assert response.status == 200 and (await response.json())["status"] == "ready"


async def test_call_created_and_deleted(start_gateway, http, offer_sdp):
    gateway = await start_gateway()
    status, body, headers = await post_json(http, gateway.url, json.dumps({"sdp": offer_sdp, "type": "offer"}),
                                            headers={"Content-Type": "application/json"})
    assert status == 201
    assert set(body) == {"call_id", "session_id", "resumed", "resume_token", "sdp", "type"}
    assert body["resumed"] is False
    assert body["type"] == "answer" and "a=candidate:" in body["sdp"]  # non-trickle: candidates included
    assert headers["Location"] == f"/v1/calls/{body['call_id']}"
    assert tokens.verify(body["resume_token"], gateway.registry.config.secret) == body["session_id"]
    async with http.delete(gateway.url + headers["Location"]) as response:
        assert response.status == 204
    async with http.delete(gateway.url + headers["Location"]) as response:
        assert response.status == 404
        assert_error(await response.json(), "call_not_found")
    assert not gateway.registry.calls


@pytest.mark.parametrize("payload, code", [
    (b"this is not json", "invalid_json"),
    (b"[1, 2, 3]", "invalid_json"),
    (b'{"type": "offer"}', "invalid_offer"),
    (b'{"sdp": "v=0", "type": "answer"}', "invalid_offer"),
    (b'{"sdp": 42, "type": "offer"}', "invalid_offer"),
    (b'\xff\xfe{"sdp"', "invalid_encoding"),
    (b'{"sdp": "hello", "type": "offer"}', "invalid_sdp"),
    (b'{"sdp": "", "type": "offer"}', "invalid_sdp"),
])
async def test_malformed_json_is_400(start_gateway, http, payload, code):
    gateway = await start_gateway()
    status, body, _ = await post_json(http, gateway.url, payload, headers={"Content-Type": "application/json"})
    assert status == 400
    assert_error(body, code)
    assert not gateway.registry.calls


async def test_malformed_and_truncated_sdp_is_400(start_gateway, http, offer_sdp):
    gateway = await start_gateway()
    video_only = offer_sdp.replace("m=audio", "m=video")
    no_opus = "\r\n".join(l for l in offer_sdp.split("\r\n") if "opus" not in l)
    broken_media = re.sub(r"m=audio \d+", "m=audio x", offer_sdp)
    assert broken_media != offer_sdp
    cases = [offer_sdp[: len(offer_sdp) // 3], offer_sdp[: len(offer_sdp) * 2 // 3], video_only, no_opus,
             broken_media, "v=0\r\nm=audio 9 RTP/AVP 0\r\n", offer_sdp.replace("a=fingerprint:", "a=fingerprint:xx ")]
    for sdp in cases:
        status, body, _ = await post_json(http, gateway.url, json.dumps({"sdp": sdp, "type": "offer"}),
                                          headers={"Content-Type": "application/json"})
        assert status == 400, (cases.index(sdp), status)
        assert_error(body, "invalid_sdp")
    assert not gateway.registry.calls and gateway.registry.active == 0
    async with http.get(gateway.url + "/livez") as response:
        assert response.status == 200


async def test_oversized_bodies_are_413(start_gateway, http):
    gateway = await start_gateway()
    big = json.dumps({"sdp": "v=0\r\n" + "a=x\r\n" * 20000, "type": "offer"}).encode()
    status, body, _ = await post_json(http, gateway.url, big, headers={"Content-Type": "application/json"})
    assert status == 413
    assert_error(body, "body_too_large")

    async def chunks():  # no Content-Length: the limit must hold while streaming too
        for _ in range(100):
            yield b"x" * 4096

    status, body, _ = await post_json(http, gateway.url, chunks(), headers={"Content-Type": "application/json"})
    assert status == 413
    async with http.post(gateway.url + "/v1/whip", data=b"v=0\r\n" * 20000,
                         headers={"Content-Type": "application/sdp"}) as response:
        assert response.status == 413


async def test_wrong_content_types_are_415(start_gateway, http, offer_sdp):
    gateway = await start_gateway()
    status, body, _ = await post_json(http, gateway.url, json.dumps({"sdp": offer_sdp, "type": "offer"}),
                                      headers={"Content-Type": "text/plain"})
    assert status == 415
    assert_error(body, "unsupported_media_type")
    async with http.post(gateway.url + "/v1/whip", data=offer_sdp, headers={"Content-Type": "application/json"}) as r:
        assert r.status == 415
        assert_error(await r.json(), "unsupported_media_type")


async def test_unknown_paths_and_methods_answer_json(start_gateway, http):
    gateway = await start_gateway()
    async with http.get(gateway.url + "/v1/nothing") as response:
        assert response.status == 404
        assert_error(await response.json(), "not_found")
    async with http.get(gateway.url + "/v1/calls") as response:
        assert response.status == 405
        assert_error(await response.json(), "method_not_allowed")
    async with http.delete(gateway.url + "/v1/calls/does-not-exist") as response:
        assert response.status == 404


async def test_bad_resume_tokens_are_401(start_gateway, http, offer_sdp):
    gateway = await start_gateway()
    secret = gateway.registry.config.secret
    good = tokens.issue("abc123", secret, 60)
    forged = tokens.issue("abc123", "another-secret", 60)
    expired = tokens.issue("abc123", secret, -10)
    tampered = good[:-2] + ("AA" if not good.endswith("AA") else "BB")
    for token in [forged, expired, tampered, "garbage", 12345, "x" * 5000]:
        payload = json.dumps({"sdp": offer_sdp, "type": "offer", "resume_token": token})
        status, body, _ = await post_json(http, gateway.url, payload, headers={"Content-Type": "application/json"})
        assert status == 401, token
        assert_error(body, "invalid_resume_token")
    # Well signed, but no such session on this deployment: not found, not a new session.
    payload = json.dumps({"sdp": offer_sdp, "type": "offer", "resume_token": good})
    status, body, _ = await post_json(http, gateway.url, payload, headers={"Content-Type": "application/json"})
    assert status == 404
    assert_error(body, "session_not_found")
    assert gateway.registry.active == 0


async def test_whip_offer_and_delete(start_gateway, http, offer_sdp):
    gateway = await start_gateway()
    async with http.post(gateway.url + "/v1/whip", data=offer_sdp, headers={"Content-Type": "application/sdp"}) as r:
        assert r.status == 201
        assert r.headers["Content-Type"].startswith("application/sdp")
        answer = await r.text()
        location = r.headers["Location"]
    assert answer.startswith("v=0") and "a=sendrecv" in answer and "useinbandfec=1" in answer
    async with http.delete(gateway.url + location) as r:
        assert r.status == 204
    async with http.post(gateway.url + "/v1/whip", data="nonsense", headers={"Content-Type": "application/sdp"}) as r:
        assert r.status == 400
        assert_error(await r.json(), "invalid_sdp")


async def test_burst_beyond_max_sessions_is_429_and_nothing_leaks(start_gateway, http, offer_sdp):
    max_sessions = 3
    gateway = await start_gateway(max_sessions=max_sessions, retry_after_s=3)
    payload = json.dumps({"sdp": offer_sdp, "type": "offer"})

    async def offer():
        async with http.post(gateway.url + "/v1/calls", data=payload,
                             headers={"Content-Type": "application/json"}) as response:
            return response.status, await response.json(), response.headers.get("Retry-After")

    results = await asyncio.gather(*(offer() for _ in range(200)))
    statuses = [status for status, _, _ in results]
    assert statuses.count(201) == max_sessions
    assert statuses.count(429) == 200 - max_sessions
    for status, body, retry_after in results:
        if status == 429:
            assert_error(body, "too_many_sessions")
            assert retry_after == "3"
    async with http.get(gateway.url + "/readyz") as response:
        assert response.status == 503 and response.headers["Retry-After"] == "3"
    async with http.get(gateway.url + "/livez") as response:
        assert response.status == 200

    for status, body, _ in results:
        if status == 201:
            async with http.delete(f"{gateway.url}/v1/calls/{body['call_id']}") as response:
                assert response.status == 204
    assert not gateway.registry.calls and gateway.registry.active == 0
    async with http.get(gateway.url + "/readyz") as response:
        assert response.status == 200

    gc.collect()
    with warnings.catch_warnings():  # scanning every object pokes deprecated torch attributes
        warnings.simplefilter("ignore")
        alive = [o for o in gc.get_objects() if isinstance(o, RTCPeerConnection) and o.connectionState != "closed"]
    assert len(alive) == 1  # only the fixture's own offerer


async def test_unconnected_calls_time_out(start_gateway, http, offer_sdp):
    gateway = await start_gateway(connect_timeout_s=0.5)
    status, body, _ = await post_json(http, gateway.url, json.dumps({"sdp": offer_sdp, "type": "offer"}),
                                      headers={"Content-Type": "application/json"})
    assert status == 201
    call = gateway.registry.calls[body["call_id"]]
    await asyncio.wait_for(call.closed.wait(), 30)
    assert call.close_reason == "connect_timeout"
    assert not gateway.registry.calls


async def test_debug_timing(start_gateway, http):
    gateway = await start_gateway()
    async with http.get(gateway.url + "/debug/timing?seconds=5") as response:
        body = await response.json()
        assert response.status == 200 and body["calls"] == 0 and "loop_lag_ms" in body
    async with http.get(gateway.url + "/debug/timing?seconds=abc") as response:
        assert response.status == 400
        assert_error(await response.json(), "bad_request")


async def test_media_ports_stay_in_the_configured_range(start_gateway, http):
    import random
    import re

    from tests.test_resume import connect

    first = random.randrange(41000, 60000)
    gateway = await start_gateway(media_ports=f"{first}-{first + 49}")
    caller = await connect(gateway.url, http)
    ports = [int(m) for m in re.findall(r"a=candidate:\S+ \d+ udp \d+ \S+ (\d+) typ host", caller.response["sdp"])]
    assert ports and all(first <= port <= first + 49 for port in ports), ports
    await caller.wait_connected(30)
    await caller.hang_up(http)

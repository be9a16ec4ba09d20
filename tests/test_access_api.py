"""API keys, call tokens, origin checks, CORS and rate limits against a live gateway."""

import asyncio
import ipaddress
import json
import logging
import time

import aiohttp
import numpy as np
import pytest

from gateway import call_tokens
from gateway.api_keys import digest
from gateway.client_ip import client_address, parse_networks
from gateway.config import Config, ConfigError
from gateway.dialog import Turn
from gateway.responders import collect
from tests.test_api import assert_error, offer_sdp  # noqa: F401 (a fixture)

API_KEY = "shop-key-0123456789abcdef"
SHOP = "http://shop.example:8000"
OTHER = "https://other.example"
JSON = {"Content-Type": "application/json"}
# A flow an operator offers besides the default one (config `flows`: orders=FILE).
ORDERS_FLOW = """
greeting: "Orders line. Who am I speaking with?"
fallback: "The orders line did not catch that."
intents:
  name:
    keywords: [name, sue, my]
    reply: "Thank you. The orders line will call you back."
"""
ORDERS_REPLIES = ("Thank you. The orders line will call you back.", "The orders line did not catch that.")


@pytest.fixture
def orders_flow(tmp_path):
    path = tmp_path / "orders.yaml"
    path.write_text(ORDERS_FLOW)
    return path


@pytest.fixture
async def keyed_gateway(start_gateway, orders_flow):
    return await start_gateway(api_keys=[API_KEY], allowed_origins=[SHOP, OTHER], flows=[f"orders={orders_flow}"])


async def get_token(http, url, key=API_KEY, **request):
    request.setdefault("origins", [SHOP])
    async with http.post(url + "/v1/tokens", json=request, headers={"Authorization": f"Bearer {key}"}) as response:
        return response.status, await response.json()


async def place_call(http, url, sdp, token=None, origin=SHOP, **extra):
    headers = {**JSON, **({"Authorization": f"Bearer {token}"} if token else {}), **({"Origin": origin} if origin else {})}
    async with http.post(url + "/v1/calls", data=json.dumps({"sdp": sdp, "type": "offer", **extra}),
                         headers=headers) as response:
        return response.status, await response.json(), response.headers


async def hang_up(http, gateway, body):
    async with http.delete(f"{gateway.url}/v1/calls/{body['call_id']}") as response:
        assert response.status == 204


async def test_tokens_are_issued_for_a_valid_key(keyed_gateway, http):
    before = time.time()
    status, body = await get_token(http, keyed_gateway.url, origins=[SHOP, "https://OTHER.example:443"], ttl_s=120,
                                   flow="orders")
    assert status == 201 and set(body) == {"token", "expires_at"}
    assert before + 120 - 1 <= body["expires_at"] <= time.time() + 120
    grant = call_tokens.verify(body["token"], keyed_gateway.registry.config.secret)
    assert grant.origins == (SHOP, OTHER) and grant.flow == "orders"


async def test_tokens_need_a_valid_key(keyed_gateway, http):
    for headers in ({}, {"Authorization": "Bearer wrong-key-0123456789"}, {"Authorization": API_KEY},
                    {"Authorization": "Basic " + API_KEY}):
        async with http.post(keyed_gateway.url + "/v1/tokens", json={"origins": [SHOP]}, headers=headers) as response:
            assert response.status == 401 and response.headers["WWW-Authenticate"] == "Bearer"
            assert_error(await response.json(), "invalid_api_key")


@pytest.mark.parametrize("request_body, status, code", [
    ({}, 400, "invalid_token_request"),
    ({"origins": []}, 400, "invalid_token_request"),
    ({"origins": SHOP}, 400, "invalid_token_request"),
    ({"origins": ["https://shop.example/checkout"]}, 400, "invalid_origin"),
    ({"origins": ["https://*.example"]}, 400, "invalid_origin"),
    ({"origins": [7]}, 400, "invalid_origin"),
    ({"origins": ["https://evil.example"]}, 403, "origin_not_allowed"),
    ({"origins": [SHOP], "ttl_s": 0}, 400, "invalid_ttl"),
    ({"origins": [SHOP], "ttl_s": 3601}, 400, "invalid_ttl"),
    ({"origins": [SHOP], "ttl_s": "300"}, 400, "invalid_ttl"),
    ({"origins": [SHOP], "ttl_s": True}, 400, "invalid_ttl"),
    ({"origins": [SHOP], "flow": "a/b"}, 400, "invalid_flow"),
    ({"origins": [SHOP], "flow": "billing"}, 400, "unknown_flow"),
    ({"origins": [SHOP], "flow": 7}, 400, "invalid_flow"),
    ({"origins": [SHOP], "scope": "all"}, 400, "invalid_token_request"),
])
async def test_bad_token_requests_get_clear_errors(keyed_gateway, http, request_body, status, code):
    async with http.post(keyed_gateway.url + "/v1/tokens", json=request_body,
                         headers={"Authorization": f"Bearer {API_KEY}"}) as response:
        assert response.status == status
        assert_error(await response.json(), code)


async def test_token_requests_that_are_not_json_objects(keyed_gateway, http):
    auth = {"Authorization": f"Bearer {API_KEY}"}
    for data, headers, status, code in (("[1]", JSON, 400, "invalid_json"), ("{", JSON, 400, "invalid_json"),
                                        ("origins", {"Content-Type": "text/plain"}, 415, "unsupported_media_type")):
        async with http.post(keyed_gateway.url + "/v1/tokens", data=data, headers={**auth, **headers}) as response:
            assert response.status == status
            assert_error(await response.json(), code)


async def test_a_call_needs_a_valid_token_from_an_origin_it_names(keyed_gateway, http, offer_sdp):
    gateway = keyed_gateway
    secret = gateway.registry.config.secret
    status, body, headers = await place_call(http, gateway.url, offer_sdp)
    assert status == 401 and headers["WWW-Authenticate"] == "Bearer"
    assert_error(body, "unauthorized")

    expired, _ = call_tokens.issue([SHOP], 60, secret, now=time.time() - 120)
    forged, _ = call_tokens.issue([SHOP], 60, "not the gateway's secret")
    for token, code in ((expired, "token_expired"), (forged, "invalid_token"), ("garbage", "invalid_token")):
        status, body, _ = await place_call(http, gateway.url, offer_sdp, token)
        assert status == 401, code
        assert_error(body, code)

    _, issued = await get_token(http, gateway.url)
    for origin in (OTHER, "http://shop.example", "http://shop.example:8001", "http://shop.example:8000.evil.example",
                   None):
        status, body, _ = await place_call(http, gateway.url, offer_sdp, issued["token"], origin=origin)
        assert status == 403, origin
        assert_error(body, "origin_not_allowed")
    assert not gateway.registry.calls

    status, body, headers = await place_call(http, gateway.url, offer_sdp, issued["token"])
    assert status == 201 and headers["Access-Control-Allow-Origin"] == SHOP
    assert "Location" in headers["Access-Control-Expose-Headers"]
    # The resume token admits a reconnect, with no call token (it may have expired by then).
    await hang_up(http, gateway, body)


async def test_a_server_may_call_with_its_api_key_and_whip_is_guarded_too(keyed_gateway, http, offer_sdp):
    status, body, _ = await place_call(http, keyed_gateway.url, offer_sdp, API_KEY, origin=None)
    assert status == 201
    await hang_up(http, keyed_gateway, body)
    async with http.post(keyed_gateway.url + "/v1/whip", data=offer_sdp,
                         headers={"Content-Type": "application/sdp"}) as response:
        assert response.status == 401
        assert_error(await response.json(), "unauthorized")
    _, issued = await get_token(http, keyed_gateway.url)
    async with http.post(keyed_gateway.url + "/v1/whip", data=offer_sdp,
                         headers={"Content-Type": "application/sdp", "Authorization": f"Bearer {issued['token']}",
                                  "Origin": OTHER}) as response:
        assert response.status == 403
        assert_error(await response.json(), "origin_not_allowed")
    async with http.post(keyed_gateway.url + "/v1/whip", data=offer_sdp,
                         headers={"Content-Type": "application/sdp", "Authorization": f"Bearer {issued['token']}",
                                  "Origin": SHOP}) as response:
        assert response.status == 201
        location = response.headers["Location"]
    async with http.delete(keyed_gateway.url + location) as response:
        assert response.status == 204


async def test_a_resume_is_admitted_by_its_resume_token(start_gateway, http, offer_sdp):
    gateway = await start_gateway(api_keys=[API_KEY], allowed_origins=[SHOP], connect_timeout_s=30)
    _, issued = await get_token(http, gateway.url, ttl_s=1)
    status, first, _ = await place_call(http, gateway.url, offer_sdp, issued["token"])
    assert status == 201
    status, body, _ = await place_call(http, gateway.url, offer_sdp, resume_token="forged.token")
    assert status == 401
    assert_error(body, "invalid_resume_token")
    status, resumed, _ = await place_call(http, gateway.url, offer_sdp, resume_token=first["resume_token"])
    assert status == 201 and resumed["session_id"] == first["session_id"] and resumed["resumed"]
    await hang_up(http, gateway, resumed)


async def test_cors_preflight_answers_only_allowed_origins(keyed_gateway, http):
    def preflight(origin, path="/v1/calls", method="POST"):
        return http.options(keyed_gateway.url + path, headers={
            "Origin": origin, "Access-Control-Request-Method": method,
            "Access-Control-Request-Headers": "authorization, content-type"})

    for path, method in (("/v1/calls", "POST"), ("/v1/whip", "POST"), ("/v1/calls/abc", "DELETE")):
        async with preflight(SHOP, path, method) as response:
            assert response.status == 204
            assert response.headers["Access-Control-Allow-Origin"] == SHOP
            assert method in response.headers["Access-Control-Allow-Methods"]
            assert "Authorization" in response.headers["Access-Control-Allow-Headers"]
    for origin in ("https://evil.example", "http://shop.example:8001", "http://shop.example", "null"):
        async with preflight(origin) as response:
            assert response.status == 403 and "Access-Control-Allow-Origin" not in response.headers
            assert_error(await response.json(), "origin_not_allowed")
    async with http.options(keyed_gateway.url + "/v1/tokens", headers={
            "Origin": SHOP, "Access-Control-Request-Method": "POST"}) as response:
        assert "Access-Control-Allow-Origin" not in response.headers  # keys never come from a browser
    async with http.get(keyed_gateway.url + "/static/parley-widget.js", headers={"Origin": SHOP}) as response:
        assert response.status == 200 and response.headers["Access-Control-Allow-Origin"] == "*"


async def test_rate_limits_per_token_and_per_ip(start_gateway, http, offer_sdp):
    gateway = await start_gateway(api_keys=[API_KEY], allowed_origins=[SHOP], rate_limit_per_token=2,
                                  rate_limit_per_ip=4)
    _, first = await get_token(http, gateway.url)
    placed = []
    for _ in range(2):
        status, body, _ = await place_call(http, gateway.url, offer_sdp, first["token"])
        assert status == 201
        placed.append(body)
    status, body, headers = await place_call(http, gateway.url, offer_sdp, first["token"])
    assert status == 429 and 1 <= int(headers["Retry-After"]) <= 30
    assert_error(body, "rate_limited")
    assert "token" in body["error"]["message"]

    _, second = await get_token(http, gateway.url)  # a fresh token, but the same address
    status, body, _ = await place_call(http, gateway.url, offer_sdp, second["token"])
    assert status == 201  # the IP's fourth call
    placed.append(body)
    status, body, headers = await place_call(http, gateway.url, offer_sdp, second["token"])
    assert status == 429 and int(headers["Retry-After"]) >= 1
    assert "address" in body["error"]["message"]
    for body in placed:
        await hang_up(http, gateway, body)


async def test_open_mode_stays_open_and_says_so(start_gateway, http, offer_sdp, caplog):
    with caplog.at_level(logging.INFO, logger="parley.access"):
        gateway = await start_gateway()
    assert any("open mode" in record.getMessage() for record in caplog.records)
    status, body, headers = await place_call(http, gateway.url, offer_sdp, origin="https://anywhere.example")
    assert status == 201 and headers["Access-Control-Allow-Origin"] == "https://anywhere.example"
    await hang_up(http, gateway, body)
    async with http.post(gateway.url + "/v1/tokens", json={"origins": [SHOP]}) as response:
        assert response.status == 404
        assert_error(await response.json(), "no_api_keys")
    for _ in range(40):  # no rate limits in open mode, as before
        async with http.options(gateway.url + "/v1/calls", headers={
                "Origin": "https://anywhere.example", "Access-Control-Request-Method": "POST"}) as response:
            assert response.status == 204


async def test_open_mode_with_allowed_origins_limits_browsers(start_gateway, http):
    gateway = await start_gateway(allowed_origins=[SHOP])
    for origin, status in ((SHOP, 204), (OTHER, 403)):
        async with http.options(gateway.url + "/v1/calls", headers={
                "Origin": origin, "Access-Control-Request-Method": "POST"}) as response:
            assert response.status == status


async def test_keys_from_a_file_of_digests(start_gateway, http, tmp_path, caplog):
    keys_file = tmp_path / "keys"
    keys_file.write_text(digest(API_KEY) + "\n")
    with caplog.at_level(logging.INFO, logger="parley.access"):
        gateway = await start_gateway(api_keys_file=str(keys_file), allowed_origins=[SHOP])
    assert not any("open mode" in record.getMessage() for record in caplog.records)
    status, body = await get_token(http, gateway.url)
    assert status == 201 and body["token"]


# -- flows named by call tokens --------------------------------------------------------------

async def test_a_token_may_name_only_a_flow_the_operator_offers(start_gateway, http, offer_sdp):
    gateway = await start_gateway(api_keys=[API_KEY], allowed_origins=[SHOP])  # no flows setting
    async with http.post(gateway.url + "/v1/tokens", json={"origins": [SHOP], "flow": "orders"},
                         headers={"Authorization": f"Bearer {API_KEY}"}) as response:
        assert response.status == 400
        body = await response.json()
    assert_error(body, "unknown_flow")
    assert "'orders' is not a flow this gateway offers" in body["error"]["message"]
    assert "PARLEY_FLOWS" in body["error"]["message"]
    # A token signed elsewhere (a node configured otherwise) for a flow this node lacks: refused.
    token, _ = call_tokens.issue([SHOP], 60, gateway.registry.config.secret, flow="orders")
    status, body, _ = await place_call(http, gateway.url, offer_sdp, token)
    assert status == 403
    assert_error(body, "unknown_flow")
    assert not gateway.registry.calls


async def test_unknown_flow_message_lists_the_offered_flows(keyed_gateway, http):
    status, body = await get_token(http, keyed_gateway.url, flow="billing")
    assert status == 400 and "(flows: orders)" in body["error"]["message"]


def test_flows_setting_is_checked_at_start(orders_flow, tmp_path):
    assert Config(flows=[f" orders = {orders_flow} "]).validate().named_flows() == {"orders": str(orders_flow)}
    bad = tmp_path / "bad.yaml"
    bad.write_text("greeting: hi\n")
    for flows, words in (([str(orders_flow)], "is not NAME=FILE"),
                         ([f"or/ders={orders_flow}"], "is not a flow name"),
                         ([f"orders={orders_flow}", f"orders={orders_flow}"], "named twice"),
                         ([f"orders={tmp_path / 'missing.yaml'}"], "flows: orders: flow file"),
                         ([f"orders={bad}"], "flows: orders: flow file")):
        with pytest.raises(ConfigError, match=words):
            Config(flows=flows).validate()
    with pytest.raises(ConfigError, match="named flows are scripted flows"):
        Config(flows=[f"orders={orders_flow}"], responder="echo").validate()


async def test_a_flow_bound_token_runs_its_flow_and_one_without_runs_the_default(start_gateway, orders_flow):
    """Conversation mode with the shipped engine: the call placed with an "orders" token hears
    the orders flow's greeting and gets its answer to the caller's words, and keeps the flow
    when it resumes; a call with a token that names no flow hears the default flow."""
    from tests.kit.peer import Caller
    from tests.test_conversation_call import conversation_engine, silence, utterance
    from tests.test_resume import DEADLINE_S, wait_until

    gateway = await start_gateway(mode="conversation", responder="scripted", speech_engine=conversation_engine(),
                                  api_keys=[API_KEY], allowed_origins=[SHOP], flows=[f"orders={orders_flow}"],
                                  connect_timeout_s=60)
    caller_headers = {"Origin": SHOP}
    async with aiohttp.ClientSession() as http:
        _, orders = await get_token(http, gateway.url, flow="orders")
        _, plain = await get_token(http, gateway.url)

    def deltas(caller, turn):
        return "".join(e["delta"] for e in caller.events if e["type"] == "response.text.delta" and e["turn"] == turn)

    async with aiohttp.ClientSession(headers={**caller_headers, "Authorization": f"Bearer {orders['token']}"}) as http:
        caller = Caller(gateway.url, np.concatenate([silence(2.5), utterance("flite_slt-020.wav"), silence(8.0)]))
        await caller.call(http)
        call = gateway.registry.by_session[caller.response["session_id"]]
        assert call.mode.responder.flow.path == str(orders_flow)
        greeting = await caller.wait_for_event("response.text.delta", DEADLINE_S)
        assert greeting["delta"] == "Orders line. Who am I speaking with?"
        await caller.wait_for_event("turn.end", DEADLINE_S)  # the caller's words (or them over the greeting)
        answer = await caller.wait_for_event("response.audio.start", DEADLINE_S,
                                             where=lambda e: e["turn"] > greeting["turn"])
        assert deltas(caller, answer["turn"]) in ORDERS_REPLIES, caller.events
        resume_token = caller.response["resume_token"]
        await caller.close()  # dropped, not hung up: the session waits for a resume
        # (its engine streams go with the call; on a loaded machine a resume that came sooner
        # would get 503 engine_busy and its Retry-After, as a client is told)
        await asyncio.wait_for(call.closed.wait(), DEADLINE_S)
        await wait_until(lambda: gateway.registry.engine.admission()[0], "the engine admitting again")

        resumed = Caller(gateway.url)
        await resumed.call(http, resume_token=resume_token)  # (the resume token admits it)
        assert resumed.response["resumed"]
        again = gateway.registry.by_session[resumed.response["session_id"]]
        assert again is not call and again.mode.responder.flow.path == str(orders_flow)
        reply = await collect(again.mode.responder.respond([Turn("user", "my name is sue")]))
        assert "orders line" in "".join(d for d in reply if isinstance(d, str))
        await resumed.hang_up(http)

    async with aiohttp.ClientSession(headers={**caller_headers, "Authorization": f"Bearer {plain['token']}"}) as http:
        caller = Caller(gateway.url)
        await caller.call(http)
        call = gateway.registry.by_session[caller.response["session_id"]]
        assert call.mode.responder.flow.path.endswith("contact_center.yaml")
        delta = await caller.wait_for_event("response.text.delta", DEADLINE_S)
        assert "Thanks for calling Acme" in delta["delta"]
        await caller.hang_up(http)


# -- the client's address behind proxies -------------------------------------------------------

def test_client_address_reads_forwarded_for_only_from_trusted_proxies():
    proxies = parse_networks(["10.0.0.0/8", "192.0.2.7"])
    assert client_address("203.0.113.9", ["198.51.100.1"], proxies) == "203.0.113.9"  # an untrusted peer
    assert client_address("10.1.2.3", [], proxies) == "10.1.2.3"  # a proxy that names nobody
    assert client_address("10.1.2.3", ["198.51.100.1"], proxies) == "198.51.100.1"
    # The right-most untrusted address: what the client wrote itself (left of it) is never read.
    assert client_address("10.1.2.3", ["1.1.1.1, 198.51.100.1"], proxies) == "198.51.100.1"
    assert client_address("10.1.2.3", ["1.1.1.1, 198.51.100.1, 192.0.2.7"], proxies) == "198.51.100.1"
    assert client_address("10.1.2.3", ["1.1.1.1", "198.51.100.1, 10.9.9.9"], proxies) == "198.51.100.1"
    assert client_address("10.1.2.3", ["10.2.2.2, 10.3.3.3"], proxies) == "10.2.2.2"  # all trusted: the left-most
    assert client_address("10.1.2.3", ["garbage, 10.3.3.3"], proxies) == "10.3.3.3"  # junk stops the walk
    assert client_address("10.1.2.3", ["198.51.100.1, unknown"], proxies) == "10.1.2.3"
    assert client_address("10.1.2.3", ["198.51.100.1:4711"], proxies) == "198.51.100.1"
    assert client_address("10.1.2.3", ["[2001:db8::1]:443"], proxies) == "2001:db8::1"
    assert client_address("::ffff:10.1.2.3", ["198.51.100.1"], proxies) == "198.51.100.1"
    assert client_address("203.0.113.9", ["198.51.100.1"], ()) == "203.0.113.9"  # none trusted: the default
    assert client_address(None, ["198.51.100.1"], proxies) == "unknown"
    with pytest.raises(ValueError, match="not an address or a CIDR"):
        parse_networks(["10.0.0.0/33"])
    with pytest.raises(ConfigError, match="trusted_proxies"):
        Config(trusted_proxies=["proxy.example"]).validate()
    assert parse_networks(["10.0.0.1/8"]) == (ipaddress.ip_network("10.0.0.0/8"),)


async def place_from(http, gateway, sdp, token, forwarded_for):
    """A call whose request carries this X-Forwarded-For."""
    headers = {**JSON, "Authorization": f"Bearer {token}", "Origin": SHOP, "X-Forwarded-For": forwarded_for}
    async with http.post(gateway.url + "/v1/calls", data=json.dumps({"sdp": sdp, "type": "offer"}),
                         headers=headers) as response:
        return response.status, await response.json(), response.headers


async def test_a_spoofed_forwarded_for_does_not_evade_the_per_ip_limit(start_gateway, http, offer_sdp):
    """Without trusted proxies, X-Forwarded-For is the client's own words: a new made-up address
    per request still counts against the peer's address."""
    gateway = await start_gateway(api_keys=[API_KEY], allowed_origins=[SHOP], rate_limit_per_ip=2,
                                  rate_limit_per_token=0)
    _, issued = await get_token(http, gateway.url)
    placed = []
    for n in range(2):
        status, body, _ = await place_from(http, gateway, offer_sdp, issued["token"], f"198.51.100.{n}")
        assert status == 201
        placed.append(body)
    status, body, headers = await place_from(http, gateway, offer_sdp, issued["token"], "198.51.100.99")
    assert status == 429 and int(headers["Retry-After"]) >= 1
    assert "address" in body["error"]["message"]
    for body in placed:
        await hang_up(http, gateway, body)


async def test_behind_a_trusted_proxy_the_limit_is_per_real_client(start_gateway, http, offer_sdp):
    """The test's own address (127.0.0.1) plays the proxy: each client it forwards has its own
    limit, and a client that prepends made-up addresses is still counted as itself."""
    gateway = await start_gateway(api_keys=[API_KEY], allowed_origins=[SHOP], rate_limit_per_ip=2,
                                  rate_limit_per_token=0, trusted_proxies=["127.0.0.0/8"])
    _, issued = await get_token(http, gateway.url)
    placed = []
    for forwarded_for in ("203.0.113.5", "1.1.1.1, 203.0.113.5"):  # the second: a spoofed hop before the real one
        status, body, _ = await place_from(http, gateway, offer_sdp, issued["token"], forwarded_for)
        assert status == 201, body
        placed.append(body)
    status, body, _ = await place_from(http, gateway, offer_sdp, issued["token"], "2.2.2.2, 203.0.113.5")
    assert status == 429, "203.0.113.5's third call"
    assert_error(body, "rate_limited")
    status, body, _ = await place_from(http, gateway, offer_sdp, issued["token"], "203.0.113.6")
    assert status == 201, "another client behind the same proxy has its own limit"
    placed.append(body)
    for body in placed:
        await hang_up(http, gateway, body)

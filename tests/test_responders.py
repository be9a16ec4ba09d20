"""Responders: the scripted demo flow in conversations transcribed the way Parley's STT
writes them (lowercase words, spoken numbers), and the openai and webhook responders
against real local HTTP servers: streaming, timeouts, errors, cancellation."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import inspect
import json
from pathlib import Path
from typing import AsyncIterator, Callable

import aiohttp
import pytest
from aiohttp import web

from gateway.config import Config, ConfigError
from gateway.responders import (EchoResponder, EndCall, FlowError, Handoff, OpenAIResponder, ResponderError,
                                ScriptedResponder, WebhookResponder, collect, load_flow, make_responder)
from gateway.responders.openai import SseEvents, chunk_delta
from gateway.responders.spoken import parse_date, parse_digits, parse_yes_no, read_date, read_digits
from gateway.dialog import Turn

pytestmark = pytest.mark.timeout(60)
TODAY = dt.date(2026, 11, 30)  # a Monday
SHORT_TIMEOUT_S = 0.5  # first-token timeout, only against servers that never answer
WAIT_S = 10.0  # generous bound for things that should happen at once (the machine may be busy)


def user(text: str) -> Turn:
    return Turn("user", text)


# -- spoken values ---------------------------------------------------------------------------

@pytest.mark.parametrize("said, digits", [
    ("four one two seven", "4127"),
    ("it's four one two seven", "4127"),
    ("4 1 2", "412"),
    ("four oh two", "402"),
    ("double five one", "551"),
    ("triple seven", "777"),
    ("forty one twenty seven", "4127"),
    ("four hundred and twelve", "412"),
    ("for one two", "412"),  # STT's homophone of "four", next to digits
    ("i don't know", None),
    ("talk to a person", None),  # "to" alone is not a two
])
def test_parse_digits(said, digits):
    assert parse_digits(said) == digits


def test_read_digits_groups_like_an_agent():
    assert read_digits("4127") == "4 1 2 7"
    assert read_digits("4127550") == "4 1 2, 7 5 5 0"
    assert read_digits("5551234567") == "5 5 5, 1 2 3, 4 5 6 7"


@pytest.mark.parametrize("said, answer", [
    ("yes", True), ("yeah", True), ("yep that's right", True), ("sure", True), ("uh huh", True),
    ("no", False), ("nope", False), ("nah", False), ("no it isn't", False), ("not really", False),
    ("no problem", True), ("i don't know", None), ("what", None), ("", None),
])
def test_parse_yes_no(said, answer):
    assert parse_yes_no(said) is answer


@pytest.mark.parametrize("said, date", [
    ("tomorrow", dt.date(2026, 12, 1)),
    ("the day after tomorrow", dt.date(2026, 12, 2)),
    ("next monday", dt.date(2026, 12, 7)),
    ("friday please", dt.date(2026, 12, 4)),
    ("march third", dt.date(2027, 3, 3)),  # no year: the next march third
    ("the twenty first of december", dt.date(2026, 12, 21)),
    ("december 3rd", dt.date(2026, 12, 3)),
    ("3/15", dt.date(2027, 3, 15)),
    ("in two days", dt.date(2026, 12, 2)),
    ("on the fifth", dt.date(2026, 12, 5)),
    ("the thirty first", dt.date(2026, 12, 31)),  # november has no thirty first
    ("february thirtieth", None),
    ("whenever", None),
])
def test_parse_date(said, date):
    assert parse_date(said, TODAY) == date


def test_read_date():
    assert read_date(dt.date(2026, 12, 21)) == "Monday, December twenty first"


# -- the scripted demo flow ------------------------------------------------------------------

class Caller:
    """Drives a responder turn by turn, keeping the history the conversation loop would keep."""

    def __init__(self, responder) -> None:
        self.responder, self.history = responder, []

    async def greeting(self) -> str:
        return "".join(d for d in await collect(self.responder.start()) if isinstance(d, str))

    async def says(self, text: str) -> tuple[str, list]:
        self.history.append(user(text))
        deltas = await collect(self.responder.respond(list(self.history)))
        reply = "".join(d for d in deltas if isinstance(d, str))
        self.history.append(Turn("assistant", reply))
        return reply, [d for d in deltas if not isinstance(d, str)]


@pytest.fixture
def caller() -> Caller:
    return Caller(make_responder(Config().validate(), today=lambda: TODAY))


async def test_greeting(caller):
    assert "Thanks for calling Acme" in await caller.greeting()


async def test_order_status_reads_the_number_back(caller):
    reply, actions = await caller.says("hi i'm calling about my order")
    assert "order number" in reply and not actions
    reply, actions = await caller.says("yeah it's four one two seven five five")
    assert "4 1 2, 7 5 5" in reply and "shipped" in reply and not actions


async def test_order_number_in_the_first_sentence(caller):
    reply, _ = await caller.says("where is my order four one two seven")
    assert "order number 4 1 2 7" in reply


async def test_reprompt_then_answer(caller):
    await caller.says("i want to check on a delivery")
    reply, actions = await caller.says("um i don't have it in front of me")
    assert "one digit at a time" in reply and not actions
    reply, _ = await caller.says("okay it's double five oh one")
    assert "5 5 0 1" in reply


async def test_too_short_number_is_reprompted(caller):
    await caller.says("where's my package")
    reply, _ = await caller.says("twelve")  # two digits: the demo's orders have four to ten
    assert "one digit at a time" in reply


async def test_give_up_after_max_reprompts_hands_off(caller):
    await caller.says("order status please")
    for _ in range(2):
        reply, actions = await caller.says("i'm not sure")
        assert not actions
    reply, actions = await caller.says("i really don't know")
    assert "connect you" in reply and actions == [Handoff("the caller's answer was not understood")]
    reply, _ = await caller.says("what are your hours")  # the flow starts afresh
    assert "Monday to Friday" in reply


async def test_no_while_asked_for_a_number_does_not_hang_up(caller):
    await caller.says("where is my order")
    reply, actions = await caller.says("no")
    assert not actions and "order number" in reply


async def test_person_while_asked_for_a_number_hands_off(caller):
    await caller.says("where is my order")
    reply, actions = await caller.says("actually can i just talk to a person")
    assert isinstance(actions[0], Handoff) and "connect you" in reply


@pytest.mark.parametrize("answer, handoff", [("yes", True), ("yeah i think so", True), ("no", False),
                                             ("nope", False)])
async def test_billing_yes_no_branch(caller, answer, handoff):
    reply, _ = await caller.says("i have a question about my bill")
    assert "charge you don't recognize" in reply
    reply, actions = await caller.says(answer)
    if handoff:
        assert "billing team" in reply and actions == [Handoff("the caller disputes a charge")]
    else:
        assert "Acme app" in reply and not actions


async def test_billing_reprompts_a_non_answer(caller):
    await caller.says("there's a charge on my invoice")
    reply, actions = await caller.says("what do you mean")
    assert "yes or a no" in reply and not actions


async def test_talk_to_a_person(caller):
    reply, actions = await caller.says("can i speak to a real person please")
    assert "connect you" in reply and actions == [Handoff("the caller asked for a person")]


async def test_goodbye_ends_the_call(caller):
    await caller.says("what time do you open")
    reply, actions = await caller.says("no that's all thank you bye")
    assert "Goodbye" in reply and actions == [EndCall("the caller said goodbye")]


async def test_fallback(caller):
    reply, actions = await caller.says("what's the weather like in paris")
    assert "Sorry, I didn't get that" in reply and not actions


async def test_hello_and_yes_get_the_menu(caller):
    reply, _ = await caller.says("hello")
    assert "What would you like to do" in reply
    await caller.says("what are your opening hours")  # "... anything else I can help you with?"
    reply, actions = await caller.says("yes")
    assert "What would you like to do" in reply and not actions
    reply, _ = await caller.says("hi i'm calling about my order")  # a greeting word does not win
    assert "order number" in reply


async def test_callback_date(caller):
    reply, _ = await caller.says("could you call me back")
    assert "What day" in reply
    reply, _ = await caller.says("next monday")
    assert "Monday, December seventh" in reply


async def test_state_is_rebuilt_from_history():
    """A call resumed on another node gets a fresh responder: the history restores the flow state."""
    config = Config().validate()
    first = Caller(make_responder(config))
    await first.says("where is my order")
    second = make_responder(config)
    deltas = await collect(second.respond(first.history + [user("four one two seven")]))
    assert "4 1 2 7" in deltas[0]


async def test_echo():
    responder = make_responder(Config(responder="echo").validate())
    assert isinstance(responder, EchoResponder)
    history = [user("hello there"), Turn("assistant", "You said: hello there"), user("four one two")]
    assert await collect(responder.respond(history)) == ["You said: four one two"]
    assert await collect(responder.start()) == []


# -- flow files ------------------------------------------------------------------------------

GOOD_FLOW = """
fallback: Sorry?
intents:
  hours:
    keywords: [hours]
    reply: Nine to five.
"""


@pytest.mark.parametrize("text, problem", [
    ("fallback: [unclosed", "not valid YAML"),
    ("- a list", "expected a mapping"),
    (GOOD_FLOW + "colour: blue\n", "unknown key 'colour'"),
    ("intents: {hours: {keywords: [hours], reply: x}}", "missing required key 'fallback'"),
    (GOOD_FLOW.replace("    reply: Nine to five.\n", ""), "intents.hours: missing required key 'reply'"),
    (GOOD_FLOW.replace("keywords: [hours]", "patterns: ['(unclosed']"), "intents.hours.patterns[0]: bad regex"),
    (GOOD_FLOW.replace("keywords: [hours]", "keywords: [hours]\n    slots: [{name: n, type: number, prompt: p}]"),
     "intents.hours.slots[0].type: 'number' is not one of"),
    (GOOD_FLOW.replace("Nine to five.", "Order {order}."), "{order} names no slot"),
    (GOOD_FLOW.replace("keywords: [hours]", "keywords: [hours, no]"), "quote it"),
    (GOOD_FLOW.replace("keywords: [hours]", "keywords: [hours]\n    action: transfer"),
     "'transfer' is not one of handoff, end_call"),
    (GOOD_FLOW.replace("keywords: [hours]", "keywords: []"), "needs keywords, patterns or dtmf"),
])
def test_flow_errors_name_the_file_and_problem(tmp_path, text, problem):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(FlowError) as excinfo:
        load_flow(path)
    assert str(path) in str(excinfo.value) and problem in str(excinfo.value)


def test_missing_flow_file(tmp_path):
    with pytest.raises(FlowError, match="cannot read it"):
        load_flow(tmp_path / "none.yaml")


def test_config_rejects_a_bad_flow_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("fallback: [unclosed")
    with pytest.raises(ConfigError, match=f"flow_file: flow file {path}"):
        Config(flow_file=str(path)).validate()


def test_custom_flow_file_is_used(tmp_path):
    path = tmp_path / "hours.yaml"
    path.write_text(GOOD_FLOW)
    responder = make_responder(Config(flow_file=str(path)).validate())
    assert isinstance(responder, ScriptedResponder) and responder.flow.path == str(path)


def test_shipped_flow_is_package_data():
    assert Path(load_flow().path).parent.name == "flows"


# -- settings --------------------------------------------------------------------------------

@pytest.mark.parametrize("settings, problem", [
    ({"responder": "gpt"}, "responder: 'gpt' is not one of"),
    ({"responder": "openai"}, "needs openai_base_url and openai_model"),
    ({"responder": "openai", "openai_base_url": "http://x/v1"}, "needs openai_base_url and openai_model"),
    ({"responder": "webhook"}, "needs webhook_url"),
    ({"webhook_url": "ftp://x"}, "webhook_url"),
    ({"responder_timeout_s": 0}, "responder_timeout_s"),
])
def test_responder_settings_are_validated(settings, problem):
    with pytest.raises(ConfigError, match=problem):
        Config(**settings).validate()


def test_secrets_are_masked():
    masked = Config(openai_api_key="sk-secret", webhook_token="tok",
                    webhook_url="https://u:pw@hooks.example/x").validate().masked()
    assert masked["openai_api_key"] == "***" and masked["webhook_token"] == "***"
    assert "pw" not in masked["webhook_url"]


# -- local HTTP servers ----------------------------------------------------------------------

class Stub:
    """A local server for the network responders: records requests, serves what a test sets."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self.handler: Callable = self.sse_reply
        self.disconnected = asyncio.Event()
        self.url = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(await request.json())
        self.headers.append(dict(request.headers))
        response = self.handler(request)  # a handler may be a plain function or a coroutine function
        return await response if inspect.isawaitable(response) else response

    async def sse(self, request: web.Request, lines: list[str], then_hang: bool = False) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for line in lines:
            await response.write(line.encode())
        if then_hang:
            await asyncio.Event().wait()
        return response

    async def sse_reply(self, request: web.Request) -> web.StreamResponse:
        return await self.sse(request, [sse_chunk("Hello"), sse_chunk(" there,"),
                                        ": keep-alive\n\n", sse_chunk(" caller."),
                                        sse_chunk(None, finish="stop"), "data: [DONE]\n\n"])

    async def forever(self, request: web.Request) -> web.StreamResponse:
        """Streams a word every 50 ms until the client goes away."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            while True:
                await response.write(sse_chunk("word ").encode())
                await asyncio.sleep(0.05)
        except (ConnectionError, asyncio.CancelledError):
            self.disconnected.set()
            raise


def sse_chunk(text, finish=None) -> str:
    chunk = {"id": "c1", "object": "chat.completion.chunk",
             "choices": [{"index": 0, "delta": {} if text is None else {"content": text}, "finish_reason": finish}]}
    return f"data: {json.dumps(chunk)}\n\n"


@pytest.fixture
async def stub() -> AsyncIterator[Stub]:
    stub = Stub()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", stub.handle)
    app.router.add_post("/hook", stub.handle)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    stub.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    yield stub
    await runner.cleanup()


def openai(stub: Stub, first_s: float = WAIT_S, total_s: float = 2 * WAIT_S, **settings) -> OpenAIResponder:
    config = Config(responder="openai", openai_base_url=stub.url + "/v1", openai_model="tiny-chat",
                    openai_api_key="sk-test-secret", responder_timeout_s=first_s,
                    responder_total_timeout_s=total_s, **settings).validate()
    responder = make_responder(config)
    assert isinstance(responder, OpenAIResponder)
    return responder


INTERRUPTED = [user("where is my order"),
               Turn("assistant", "Sure, I can check on that. What's your order number?",
                    heard_text="Sure, I can"),
               user("four one two seven")]


async def test_openai_streams_deltas(stub):
    async with openai(stub, system_prompt="Be brief.") as responder:
        deltas = await collect(responder.respond(INTERRUPTED))
    assert deltas == ["Hello", " there,", " caller."]
    sent = stub.requests[0]
    assert sent["model"] == "tiny-chat" and sent["stream"] is True
    assert sent["messages"] == [{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "where is my order"},
                                {"role": "assistant", "content": "Sure, I can"},  # only what was heard
                                {"role": "user", "content": "four one two seven"}]
    assert stub.headers[0]["Authorization"] == "Bearer sk-test-secret"


async def test_openai_reuses_a_shared_session(stub):
    async with aiohttp.ClientSession() as http:
        config = Config(responder="openai", openai_base_url=stub.url + "/v1", openai_model="m").validate()
        responder = make_responder(config, http=http)
        for _ in range(2):
            assert "".join(await collect(responder.respond([user("hi")]))) == "Hello there, caller."
        await responder.aclose()
        assert not http.closed  # the gateway's session is the gateway's to close


async def test_openai_first_token_timeout(stub):
    stub.handler = lambda request: asyncio.Event().wait()  # never answers
    async with openai(stub, first_s=SHORT_TIMEOUT_S) as responder:
        with pytest.raises(ResponderError) as excinfo:
            await collect(responder.respond([user("hello")]))
    assert excinfo.value.code == "responder_timeout"
    assert f"no reply within {SHORT_TIMEOUT_S:g} s" in str(excinfo.value)


async def test_openai_keep_alives_do_not_count_as_a_first_token(stub):
    stub.handler = lambda request: stub.sse(request, [": ping\n\n"], then_hang=True)
    async with openai(stub, first_s=SHORT_TIMEOUT_S) as responder:
        with pytest.raises(ResponderError, match="no reply within") as excinfo:
            await collect(responder.respond([user("hello")]))
    assert excinfo.value.code == "responder_timeout"


async def test_openai_overall_timeout_after_the_first_token(stub):
    stub.handler = lambda request: stub.sse(request, [sse_chunk("Hel")], then_hang=True)
    async with openai(stub, first_s=2.0, total_s=2.0) as responder:
        got = []
        with pytest.raises(ResponderError, match="took longer than 2 s"):
            async for delta in responder.respond([user("hello")]):
                got.append(delta)
    assert got == ["Hel"]


async def test_openai_http_error(stub):
    async def fail(request):
        return web.json_response({"error": {"message": "model overloaded", "type": "server_error"}}, status=500)
    stub.handler = fail
    async with openai(stub) as responder:
        with pytest.raises(ResponderError) as excinfo:
            await collect(responder.respond([user("hello")]))
    assert excinfo.value.code == "responder_http_error"
    assert "HTTP 500" in str(excinfo.value) and "model overloaded" in str(excinfo.value)


async def test_openai_unauthorized_never_shows_the_key(stub):
    async def unauthorized(request):
        return web.json_response({"error": {"message": "Incorrect API key provided"}}, status=401)
    stub.handler = unauthorized
    async with openai(stub) as responder:
        with pytest.raises(ResponderError) as excinfo:
            await collect(responder.respond([user("hello")]))
    assert "HTTP 401" in str(excinfo.value) and "sk-test-secret" not in str(excinfo.value)


@pytest.mark.parametrize("bad", ["data: {not json\n\n", 'data: {"choices": "x"}\n\n',
                                 'data: {"choices": [{"delta": {"content": 5}}]}\n\n'])
async def test_openai_malformed_chunk(stub, bad):
    stub.handler = lambda request: stub.sse(request, [sse_chunk("Hi"), bad, "data: [DONE]\n\n"])
    async with openai(stub) as responder:
        with pytest.raises(ResponderError, match="malformed stream chunk") as excinfo:
            await collect(responder.respond([user("hello")]))
    assert excinfo.value.code == "responder_bad_reply"


async def test_openai_error_chunk_mid_stream(stub):
    stub.handler = lambda request: stub.sse(request, [sse_chunk("Hi"), 'data: {"error": {"message": "oops"}}\n\n'])
    async with openai(stub) as responder:
        with pytest.raises(ResponderError, match="oops"):
            await collect(responder.respond([user("hello")]))


async def test_openai_stream_cut_short(stub):
    stub.handler = lambda request: stub.sse(request, [sse_chunk("Hi")])  # no finish_reason, no [DONE]
    async with openai(stub) as responder:
        with pytest.raises(ResponderError, match="ended before the reply was complete"):
            await collect(responder.respond([user("hello")]))


async def test_openai_non_streaming_server(stub):
    async def whole(request):
        return web.json_response({"choices": [{"message": {"role": "assistant", "content": "All at once."},
                                               "finish_reason": "stop"}]})
    stub.handler = whole
    async with openai(stub) as responder:
        assert await collect(responder.respond([user("hello")])) == ["All at once."]


async def test_openai_unreachable():
    config = Config(responder="openai", openai_base_url="http://127.0.0.1:9/v1", openai_model="m").validate()
    async with make_responder(config) as responder:
        with pytest.raises(ResponderError) as excinfo:
            await collect(responder.respond([user("hello")]))
    assert excinfo.value.code in ("responder_unreachable", "responder_timeout")


def test_sse_events_join_multi_line_data():
    events = SseEvents()
    assert [events.feed(line) for line in ["event: x", "data: a", "data:b", ""]] == [None, None, None, "a\nb"]
    assert chunk_delta('{"choices": []}', "who") == ("", False)  # a usage-only chunk


async def settle_tasks(before: set[asyncio.Task]) -> set[asyncio.Task]:
    """Tasks started since `before` that are still running after a generous settling time."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while True:
        left = {t for t in asyncio.all_tasks() if not t.done()} - before - {asyncio.current_task()}
        if not left or loop.time() > deadline:
            return left
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("kind", ["openai", "webhook"])
async def test_cancel_mid_stream_closes_the_response(stub, kind):
    stub.handler = stub.forever
    responder = openai(stub) if kind == "openai" else WebhookResponder(stub.url + "/hook")
    before = set(asyncio.all_tasks())
    first = asyncio.Event()

    async def turn():
        async with contextlib.aclosing(responder.respond([user("tell me a long story")])) as reply:
            async for _ in reply:
                first.set()

    task = asyncio.create_task(turn())
    await asyncio.wait_for(first.wait(), WAIT_S)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(stub.disconnected.wait(), WAIT_S)  # the server saw the connection close
    await responder.aclose()
    assert await settle_tasks(before) == set()


async def test_closing_the_stream_between_deltas_closes_the_response(stub):
    """The loop stops reading (barge-in while a delta is being spoken), then closes the stream."""
    stub.handler = stub.forever
    async with openai(stub) as responder:
        reply = responder.respond([user("go on")])
        assert await reply.__anext__() == "word "
        await reply.aclose()
        await asyncio.wait_for(stub.disconnected.wait(), WAIT_S)


# -- webhook ---------------------------------------------------------------------------------

def webhook(stub: Stub, first_s: float = WAIT_S) -> WebhookResponder:
    config = Config(responder="webhook", webhook_url=stub.url + "/hook?key=abc", webhook_token="hook-secret",
                    responder_timeout_s=first_s, responder_total_timeout_s=2 * WAIT_S).validate()
    responder = make_responder(config, session_id="s-1")
    assert isinstance(responder, WebhookResponder)
    return responder


async def test_webhook_text_stream(stub):
    async def text(request):
        response = web.StreamResponse(headers={"Content-Type": "text/plain; charset=utf-8"})
        await response.prepare(request)
        for part in [b"Your order ", b"is on its way caf\xc3", b"\xa9."]:  # "\xc3\xa9" (é) split in two
            await response.write(part)
            await asyncio.sleep(0.01)
        return response
    stub.handler = text
    async with webhook(stub) as responder:
        deltas = await collect(responder.respond(INTERRUPTED))
    assert "".join(deltas) == "Your order is on its way caf\u00e9."
    sent = stub.requests[0]
    assert sent["session_id"] == "s-1"
    assert sent["messages"][1] == {"role": "assistant", "content": "Sure, I can", "interrupted": True}
    assert stub.headers[0]["Authorization"] == "Bearer hook-secret"


async def test_webhook_ndjson_with_actions(stub):
    async def ndjson(request):
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        for record in [{"text": "Let me get someone "}, {"text": "for you."},
                       {"action": "handoff", "reason": "caller asked"}]:
            await response.write((json.dumps(record) + "\n").encode())
        return response
    stub.handler = ndjson
    async with webhook(stub) as responder:
        deltas = await collect(responder.respond([user("a person please")]))
    assert deltas == ["Let me get someone ", "for you.", Handoff("caller asked")]


async def test_webhook_json_and_no_content(stub):
    stub.handler = lambda request: web.json_response({"text": "Goodbye.", "action": "end_call"})
    async with webhook(stub) as responder:
        assert await collect(responder.respond([user("bye")])) == ["Goodbye.", EndCall("")]
        stub.handler = lambda request: web.Response(status=204)
        assert await collect(responder.respond([user("hmm")])) == []


async def test_webhook_timeout(stub):
    stub.handler = lambda request: asyncio.Event().wait()
    async with webhook(stub, first_s=SHORT_TIMEOUT_S) as responder:
        with pytest.raises(ResponderError, match="no reply within") as excinfo:
            await collect(responder.respond([user("hello")]))
    assert excinfo.value.code == "responder_timeout"
    assert "key=abc" not in str(excinfo.value)  # a token in the URL's query stays out of errors


async def test_webhook_http_error(stub):
    stub.handler = lambda request: web.Response(status=500, text="Internal Server Error")
    async with webhook(stub) as responder:
        with pytest.raises(ResponderError, match="HTTP 500") as excinfo:
            await collect(responder.respond([user("hello")]))
    assert excinfo.value.code == "responder_http_error"


@pytest.mark.parametrize("body, problem", [("{not json\n", "malformed JSON"), ('["text"]\n', "must be an object"),
                                           ('{"action": "dance"}\n', "unknown action 'dance'")])
async def test_webhook_bad_ndjson(stub, body, problem):
    stub.handler = lambda request: web.Response(text=body, content_type="application/x-ndjson")
    async with webhook(stub) as responder:
        with pytest.raises(ResponderError, match=problem) as excinfo:
            await collect(responder.respond([user("hello")]))
    assert excinfo.value.code == "responder_bad_reply"


def sse_tool_call(index, name=None, arguments=None, finish=None) -> str:
    function = {k: v for k, v in (("name", name), ("arguments", arguments)) if v is not None}
    call = {"index": index, "function": function, **({"id": "call_1", "type": "function"} if name else {})}
    chunk = {"id": "c1", "object": "chat.completion.chunk",
             "choices": [{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": finish}]}
    return f"data: {json.dumps(chunk)}\n\n"


async def test_openai_tool_calls_become_actions_after_the_text(stub):
    async def transfer(request):  # the arguments arrive in pieces, as OpenAI streams them
        return await stub.sse(request, [sse_chunk("Let me connect you."),
                                        sse_tool_call(0, "transfer_to_human", '{"rea'),
                                        sse_tool_call(0, arguments='son": "asked for  a person"}'),
                                        sse_chunk(None, finish="tool_calls"), "data: [DONE]\n\n"])

    stub.handler = transfer
    async with openai(stub) as responder:
        deltas = await collect(responder.respond([user("can i talk to a person")]))
    assert deltas == ["Let me connect you.", Handoff(reason="asked for a person")]
    offered = [tool["function"]["name"] for tool in stub.requests[0]["tools"]]
    assert offered == ["transfer_to_human", "end_call"]

    stub.handler = lambda request: web.json_response({"choices": [{"message": {
        "content": "Goodbye.", "tool_calls": [{"index": 0, "function": {"name": "end_call", "arguments": "{}"}}]},
        "finish_reason": "tool_calls"}]})
    async with openai(stub) as responder:
        assert await collect(responder.respond([user("that's all")])) == ["Goodbye.", EndCall()]


@pytest.mark.parametrize("name, arguments, problem", [
    ("launch_rocket", "{}", "unknown tool 'launch_rocket'"),
    ("transfer_to_human", "{not json", "are not JSON"),
])
async def test_openai_bad_tool_calls_are_clear_errors(stub, name, arguments, problem):
    stub.handler = lambda request: stub.sse(request, [sse_tool_call(0, name, arguments, finish="tool_calls"),
                                                      "data: [DONE]\n\n"])
    async with openai(stub) as responder:
        with pytest.raises(ResponderError, match=problem) as excinfo:
            await collect(responder.respond([user("hi")]))
    assert excinfo.value.code == "responder_bad_reply"


async def test_openai_tools_can_be_turned_off(stub):
    stub.handler = stub.sse_reply
    async with openai(stub, openai_tools=False) as responder:
        assert "".join(await collect(responder.respond([user("hi")]))) == "Hello there, caller."
    assert "tools" not in stub.requests[0]

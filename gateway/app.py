"""The HTTP edge: signaling API, health endpoints and the demo page (aiohttp).

Wire contracts (docs/architecture.md, README "API"): POST /v1/calls (JSON offer -> 201 JSON answer),
DELETE /v1/calls/{id}, POST /v1/whip (application/sdp -> 201 SDP answer), /livez, /readyz,
/metrics (Prometheus text format).
Errors are always {"error": {"code", "message"}}; client input never causes a 500.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import secrets
import time
from pathlib import Path
from typing import Any, Callable, Optional

import jinja2
from aiohttp import web

from . import echo_test, tokens
from .access import CallAccess
from .call import Call, ModeFactory, echo_test_mode
from .config import ENGINE_MODES, Config
from .engine_host import EngineHost
from .errors import ApiError, error_response
from .events import EventChannel
from .ice import bind_media_ports, parse_port_range
from .keeper import LiveSession, SessionBusy, SessionKeeper
from .logs import CallLogger
from .nodes import NodeRegistry, NodeStatus
from .sessions import SessionNotFound, StoreUnavailable, open_store
from .conversation import Conversation
from .recording import CallRecording
from .responders import make_responder
from .transcribe import Transcribe
from .loop_monitor import LoopLagMonitor, percentiles
from .metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from .metrics import Metrics, run_sampler
from .pacer import FRAME_MS
from .sdp import MAX_SDP_BYTES, SdpError
from .warmup import WarmUp, WarmUpFn

log = logging.getLogger("parley.app")

ROOT = Path(__file__).resolve().parent.parent
MAX_BODY_BYTES = MAX_SDP_BYTES  # 64 KiB for JSON and SDP bodies alike
CONFIG_KEY = web.AppKey("config", Config)
CALLS_KEY = web.AppKey("calls", "CallRegistry")
WARMUP_KEY = web.AppKey("warmup", WarmUp)
ENGINE_KEY = web.AppKey("engine", EngineHost)
SIP_KEY = web.AppKey("sip", "SipAgent")
ACCESS_KEY = web.AppKey("access", CallAccess)
CLIENT_CLOSED_STATUS = 499  # the metrics' status for a request the client abandoned (nginx's convention)
DRAIN_POLL_S = 0.1  # how often a drain checks whether the last call has ended
WARM_UPS: dict[str, WarmUpFn] = {"echo-test": echo_test.warm_up}  # per mode; an engine mode adds its own


_HTTP_CODES = {400: "bad_request", 404: "not_found", 405: "method_not_allowed", 413: "body_too_large",
               415: "unsupported_media_type", 431: "headers_too_large"}


@web.middleware
async def json_errors(request: web.Request, handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        return error_response(exc.status, exc.code, exc.message, exc.headers)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        keep = {k: v for k, v in exc.headers.items() if k.lower() in ("allow", "retry-after")}
        return error_response(exc.status, _HTTP_CODES.get(exc.status, "http_error"), exc.reason, keep)
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("unhandled error", extra={"path": request.path})
        return error_response(500, "internal", "internal error; the server keeps serving")


@web.middleware
async def count_requests(request: web.Request, handler) -> web.StreamResponse:
    """parley_http_requests_total{route, status}; route is the template, so ids never become labels."""
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else "unmatched"
    status = 500
    try:
        response = await handler(request)
        status = response.status
        return response
    except web.HTTPException as exc:
        status = exc.status
        raise
    except asyncio.CancelledError:
        status = CLIENT_CLOSED_STATUS
        raise
    finally:
        request.app[CALLS_KEY].metrics.http_requests.labels(route=route, status=str(status)).inc()


class CallRegistry:
    """Live calls, with a slot reserved before any await so max_sessions holds under bursts.

    Each call drives one session; the keeper holds the session's state and lease, and a
    resumed session replaces the call that drove it before (on this node or another).
    """

    def __init__(self, config: Config, engine: Optional[EngineHost] = None) -> None:
        self.config = config
        self.engine = engine
        self.calls: dict[str, Call] = {}
        self.by_session: dict[str, Call] = {}
        self.keeper = SessionKeeper(open_store(config.redis_url or None), config.node_id, config.lease_ttl_s,
                                    allow_new_without_store=config.new_calls_without_redis == "accept")
        self.keeper.on_lease_lost = self._taken_over
        self.nodes = NodeRegistry(config.redis_url or None, heartbeat_s=config.lease_ttl_s / 3)
        self._reserved = 0
        self.draining = False
        self.drain_task: Optional[asyncio.Task] = None
        self.loop_lag = LoopLagMonitor()
        self.metrics = Metrics()
        self.metrics.active_sessions.set_function(lambda: self.active)
        self.metrics.draining.set_function(lambda: int(self.draining))
        if engine is not None:
            self.metrics.registry.register(engine)

    @property
    def active(self) -> int:
        return len(self.calls) + self._reserved

    @property
    def full(self) -> bool:
        return self.active >= self.config.max_sessions

    def reserve(self) -> None:
        if self.full:
            raise ApiError(429, "too_many_sessions",
                           f"this node is at its limit of {self.config.max_sessions} sessions",
                           {"Retry-After": str(self.config.retry_after_s)})
        if self.engine is not None:
            admit, retry_after_s = self.engine.admission()
            if not admit:
                raise ApiError(503, "engine_busy", "the speech engine is at capacity; try again shortly",
                               {"Retry-After": str(max(1, math.ceil(retry_after_s)))})
        self._reserved += 1

    async def open(self, offer_sdp: str, session_id: Optional[str], last_seq: int,
                   make_call: Callable[..., Any] = Call) -> tuple[Call, str]:
        """Answer an offer for a new session (session_id None) or a resumed one; the caller
        must have reserved a slot, which this releases. `make_call` builds the call (a SIP
        call's class, gateway/sip/call.py, takes Call's arguments and answers G.711 SDP)."""
        try:
            session = await self._session(session_id)
            call = self._new_call(session, resumed=session_id is not None, last_seq=last_seq, make_call=make_call)
            try:
                answer = await call.answer(offer_sdp)
            except BaseException:
                await call.close("rejected")
                raise
        finally:
            self._reserved -= 1
        self.calls[call.call_id] = call
        self.by_session[call.session_id] = call
        return call, answer

    async def _session(self, session_id: Optional[str]) -> LiveSession:
        retry = {"Retry-After": str(self.config.retry_after_s)}
        try:
            if session_id is None:
                return await self.keeper.open_new(secrets.token_hex(12))
            previous = self.by_session.get(session_id)
            if previous is not None:  # the caller reconnected before this node noticed the drop
                await previous.close("replaced")
            return await self.keeper.resume(session_id)
        except SessionNotFound:
            raise ApiError(404, "session_not_found", "the session has ended or expired; start a new call") from None
        except SessionBusy as exc:
            raise ApiError(409, "session_busy", str(exc), retry) from None
        except StoreUnavailable:
            raise ApiError(503, "store_unavailable", "session storage is unavailable; try again shortly",
                           retry) from None

    def _new_call(self, session: LiveSession, resumed: bool, last_seq: int,
                  make_call: Callable[..., Any] = Call) -> Call:
        session_id = session.record.session_id
        # The client may have seen events the store had not yet written when a node died.
        events = EventChannel(last_seq=max(session.record.last_event_seq, last_seq),
                              on_emit=lambda event, text: self._on_event(session_id, event, text))
        if resumed:
            events.replay(self.keeper.replay_after(session_id, last_seq))
        return make_call(secrets.token_hex(8), session_id, self.config, self._forget, self.loop_lag,
                         events=events, resumed=resumed, mode=self._mode(session))

    def _on_event(self, session_id: str, event: dict, text: str) -> None:
        self.keeper.record_event(session_id, event, text)
        self.metrics.observe_event(event)

    def _mode(self, session: LiveSession) -> ModeFactory:
        if self.config.mode not in ENGINE_MODES:
            return echo_test_mode(self.config)
        session_id = session.record.session_id
        try:
            stream = self.engine.open_stt(session_id)
        except Exception as exc:  # CapacityError, or the engine closing under us
            raise ApiError(503, "engine_busy", f"the speech engine cannot take this call: {exc}",
                           {"Retry-After": str(self.config.retry_after_s)}) from None
        if self.config.mode == "transcribe":
            return lambda pacer, events, hang_up: Transcribe(stream, events)
        return lambda pacer, events, hang_up: self._conversation(session, stream, pacer, events, hang_up)

    def _conversation(self, session: LiveSession, stt: Any, pacer: Any, events: EventChannel,
                      hang_up: Any) -> Conversation:
        """The conversation keeps its history in the session record, so a resume finds it."""
        record = session.record

        def saved() -> None:  # called only after construction, so `conversation` is bound
            record.in_progress = conversation.in_progress
            self.keeper.save(record.session_id)

        conversation = Conversation(stt, lambda: self.engine.open_tts(record.session_id),
                                    make_responder(self.config, session_id=record.session_id), pacer, events,
                                    history=record.history, pending=record.in_progress, hang_up=hang_up,
                                    resume_unfinished=self.config.resume_unfinished, on_change=saved,
                                    idle_prompt_s=self.config.idle_prompt_s, idle_hangup_s=self.config.idle_hangup_s,
                                    max_turn_s=self.config.max_turn_s, recording=self._recording(record.session_id),
                                    reopen_stt=lambda: self.engine.open_stt(record.session_id),
                                    log_content=self.config.privacy_log_content,
                                    logger=CallLogger(logging.getLogger("parley.conversation"),
                                                      {"session_id": record.session_id}))
        return conversation

    def _recording(self, session_id: str) -> Optional[CallRecording]:
        if not self.config.record_dir:
            return None
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        return CallRecording(Path(self.config.record_dir) / f"{stamp}-{session_id}-{secrets.token_hex(2)}.wav")

    async def _forget(self, call: Call) -> None:
        self.calls.pop(call.call_id, None)
        if self.by_session.get(call.session_id) is call:
            del self.by_session[call.session_id]
            if call.close_reason != "taken_over":
                await self.keeper.end(call.session_id)
        self.metrics.call_ended(call)

    async def _taken_over(self, session_id: str) -> None:
        call = self.by_session.get(session_id)
        if call is not None:
            await call.close("taken_over")

    def status(self, ready: bool) -> NodeStatus:
        return NodeStatus(self.config.node_id, self.config.public_url, ready and not self.draining and not self.full,
                          self.draining, self.active, self.config.max_sessions, time.time())

    def start_drain(self, timeout_s: float) -> asyncio.Task:
        """Begin draining in the background (once); the task ends when the drain is done."""
        self.draining = True
        if self.drain_task is None:
            self.drain_task = asyncio.get_running_loop().create_task(self.drain(timeout_s))
        return self.drain_task

    async def drain(self, timeout_s: float) -> None:
        """Refuse new calls, let live ones run up to `timeout_s`, then migrate the rest away."""
        self.draining = True
        await self.nodes.publish(self.status(ready=False))  # peers stop sending callers here at once
        log.info("draining", extra={"active_sessions": self.active, "drain_timeout_s": timeout_s})
        deadline = time.monotonic() + timeout_s
        while self.active and time.monotonic() < deadline:
            await asyncio.sleep(DRAIN_POLL_S)
        remaining = list(self.calls.values())
        if remaining:
            log.info("drain timeout: migrating remaining calls", extra={"calls": len(remaining)})
        await asyncio.gather(*(self.migrate(call) for call in remaining))

    async def migrate(self, call: Call) -> None:
        """Send the client to another node (session.migrate with a fresh resume token)."""
        token = tokens.issue(call.session_id, self.config.secret, self.config.resume_token_ttl_s)
        await call.migrate_away("draining", token, self.config.retry_after_s)

    async def close_all(self, reason: str) -> None:
        await asyncio.gather(*(call.close(reason) for call in list(self.calls.values())))


# -- request helpers ------------------------------------------------------------------------

async def read_body(request: web.Request, content_type: str) -> bytes:
    if request.content_type != content_type:
        raise ApiError(415, "unsupported_media_type", f"Content-Type must be {content_type}")
    if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
        raise ApiError(413, "body_too_large", f"body exceeds {MAX_BODY_BYTES} bytes")
    body = bytearray()
    async for chunk in request.content.iter_chunked(16 * 1024):
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise ApiError(413, "body_too_large", f"body exceeds {MAX_BODY_BYTES} bytes")
    return bytes(body)


def decode_text(body: bytes) -> str:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError(400, "invalid_encoding", "body must be UTF-8") from None


def parse_offer_json(body: bytes) -> dict[str, Any]:
    try:
        payload = json.loads(decode_text(body))
    except ValueError:
        raise ApiError(400, "invalid_json", "body is not valid JSON") from None
    if not isinstance(payload, dict):
        raise ApiError(400, "invalid_json", "body must be a JSON object")
    if payload.get("type") != "offer":
        raise ApiError(400, "invalid_offer", "'type' must be \"offer\"")
    if not isinstance(payload.get("sdp"), str):
        raise ApiError(400, "invalid_offer", "'sdp' must be a string")
    return payload


def resumed_session(payload: dict[str, Any], config: Config) -> Optional[str]:
    """None for a new session, or the id a valid resume token names (401 otherwise)."""
    if payload.get("resume_token") is None:
        return None
    try:
        return tokens.verify(payload["resume_token"], config.secret)
    except tokens.TokenError as exc:
        raise ApiError(401, "invalid_resume_token", str(exc)) from None


def last_seq_of(payload: dict[str, Any]) -> int:
    """The last event seq the resuming client saw (events after it are replayed)."""
    last_seq = payload.get("last_seq", 0)
    if not isinstance(last_seq, int) or isinstance(last_seq, bool) or last_seq < 0:
        raise ApiError(400, "invalid_last_seq", "'last_seq' must be a non-negative integer")
    return last_seq


async def answer_offer(request: web.Request, offer_sdp: str, session_id: Optional[str] = None,
                       last_seq: int = 0) -> tuple[Call, str]:
    registry = request.app[CALLS_KEY]
    if registry.draining:
        peer = await registry.nodes.ready_peer(registry.config.node_id)
        if peer is not None:
            raise web.HTTPTemporaryRedirect(peer.url.rstrip("/") + request.path_qs)
        raise ApiError(503, "draining", "this node is draining", {"Retry-After": str(registry.config.retry_after_s)})
    registry.reserve()
    try:
        return await registry.open(offer_sdp, session_id, last_seq)
    except SdpError as exc:
        raise ApiError(400, "invalid_sdp", str(exc)) from None


# -- handlers ---------------------------------------------------------------------------------

async def create_call(request: web.Request) -> web.Response:
    config = request.app[CONFIG_KEY]
    payload = parse_offer_json(await read_body(request, "application/json"))
    session_id = resumed_session(payload, config)
    request.app[ACCESS_KEY].admit_call(request, resuming=session_id is not None)
    call, answer = await answer_offer(request, payload["sdp"], session_id, last_seq_of(payload))
    location = f"/v1/calls/{call.call_id}"
    body = {
        "call_id": call.call_id,
        "session_id": call.session_id,
        "resumed": call.resumed,
        "resume_token": tokens.issue(call.session_id, config.secret, config.resume_token_ttl_s),
        "sdp": answer,
        "type": "answer",
    }
    return web.json_response(body, status=201, headers={"Location": location})


async def create_whip(request: web.Request) -> web.Response:
    offer = decode_text(await read_body(request, "application/sdp"))
    request.app[ACCESS_KEY].admit_call(request, resuming=False)
    call, answer = await answer_offer(request, offer)
    headers = {"Location": f"/v1/whip/{call.call_id}", "Content-Type": "application/sdp"}
    return web.Response(status=201, text=answer, headers=headers, content_type=None)


async def delete_call(request: web.Request) -> web.Response:
    registry = request.app[CALLS_KEY]
    call = registry.calls.get(request.match_info["call_id"])
    if call is None:
        raise ApiError(404, "call_not_found", "no such call on this node")
    await call.close("hangup")
    return web.Response(status=204)


async def livez(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    registry = request.app[CALLS_KEY]
    warmup = request.app[WARMUP_KEY]
    retry = {"Retry-After": str(registry.config.retry_after_s)}
    if registry.draining:
        return error_response(503, "draining", "this node is draining", retry)
    if warmup.error is not None:
        return error_response(503, "warm_up_failed", f"warm-up failed: {warmup.error}", retry)
    if not warmup.ready:
        return error_response(503, "warming_up", "this node is still warming up", retry)
    if registry.full:
        return error_response(503, "full", "this node is at its session limit", retry)
    if registry.engine is not None and not registry.engine.admission()[0]:
        return error_response(503, "full", "the speech engine is at capacity", retry)
    return web.json_response({"status": "ready", "active_sessions": registry.active})


async def debug_timing(request: web.Request) -> web.Response:
    """Timing over the last `seconds` (1-60), for benchmarks: the event loop's lag, and the raw
    per-frame pacing lateness of every live call pooled (call.stats has per-call minute percentiles)."""
    try:
        seconds = min(max(float(request.query.get("seconds", "10")), 1.0), 60.0)
    except ValueError:
        raise ApiError(400, "bad_request", "'seconds' must be a number") from None
    registry = request.app[CALLS_KEY]
    frames = int(seconds * 1000 / FRAME_MS)
    lateness = [late for call in registry.calls.values() for late in call.pacer.lateness_samples()[-frames:]]
    return web.json_response({"seconds": seconds, "calls": len(registry.calls),
                              "loop_lag_ms": percentiles(registry.loop_lag.recent(seconds)),
                              "pacing_lateness_ms": percentiles(lateness)})


async def metrics(request: web.Request) -> web.Response:
    """Prometheus text exposition of this app's registry."""
    body = request.app[CALLS_KEY].metrics.exposition()
    return web.Response(body=body, headers={"Content-Type": METRICS_CONTENT_TYPE})


_templates = jinja2.Environment(loader=jinja2.FileSystemLoader(ROOT / "web"), autoescape=True)


async def demo_page(request: web.Request) -> web.Response:
    config = request.app[CONFIG_KEY]
    html = _templates.get_template("index.html").render(mode=config.mode, echo_delay_ms=config.echo_delay_ms)
    return web.Response(text=html, content_type="text/html")


async def heartbeat(registry: CallRegistry, warmup: WarmUp) -> None:
    """Publish this node's status to the registry (peers redirect drained calls by it)."""
    while True:
        await registry.nodes.publish(registry.status(warmup.ready))
        await asyncio.sleep(registry.nodes.heartbeat_s)


def create_app(config: Config, warm_up: Optional[WarmUpFn] = None, speech_engine: Any = None) -> web.Application:
    """The gateway app; `warm_up` replaces the mode's warm-up (tests make it controllable), and
    `speech_engine` the engine an engine mode would build from its weights."""
    access = CallAccess(config)
    app = web.Application(middlewares=[count_requests, access.cors, json_errors], client_max_size=MAX_BODY_BYTES)
    app[CONFIG_KEY] = config
    app[ACCESS_KEY] = access
    host = EngineHost(config, speech_engine) if config.mode in ENGINE_MODES else None
    app[CALLS_KEY] = CallRegistry(config, host)
    app[WARMUP_KEY] = WarmUp(warm_up or (host.warm_up if host else WARM_UPS[config.mode]))
    app[CALLS_KEY].metrics.ready.set_function(lambda: int(app[WARMUP_KEY].ready and not app[CALLS_KEY].draining))
    app.router.add_post("/v1/tokens", access.issue_token)
    app.router.add_post("/v1/calls", create_call)
    app.router.add_delete("/v1/calls/{call_id}", delete_call)
    app.router.add_post("/v1/whip", create_whip)
    app.router.add_delete("/v1/whip/{call_id}", delete_call)
    app.router.add_get("/livez", livez)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/debug/timing", debug_timing)
    app.router.add_get("/", demo_page)
    app.router.add_static("/static", ROOT / "static")

    async def start_background(app: web.Application) -> None:
        registry = app[CALLS_KEY]
        access.log_mode()
        if config.media_ports:
            bind_media_ports(asyncio.get_running_loop(), *parse_port_range(config.media_ports))
        registry.loop_lag.start()
        registry.keeper.start()
        app[WARMUP_KEY].start()
        loop = asyncio.get_running_loop()
        tasks = [loop.create_task(run_sampler(registry.metrics, registry)),
                 loop.create_task(heartbeat(registry, app[WARMUP_KEY]))]
        yield
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await registry.nodes.remove(config.node_id)
        await registry.nodes.close()
        await registry.keeper.stop()
        await app[WARMUP_KEY].stop()
        if registry.engine is not None:
            await registry.engine.close()

    async def close_calls(app: web.Application) -> None:
        await app[CALLS_KEY].close_all("shutdown")
        await app[CALLS_KEY].loop_lag.stop()

    app.cleanup_ctx.append(start_background)
    app.on_shutdown.append(close_calls)
    if config.sip_port:  # phones and PBXs call in over SIP too (gateway/sip/, docs/sip.md)
        from .sip.agent import SipAgent

        app[SIP_KEY] = SipAgent(config, app[CALLS_KEY], app[WARMUP_KEY])
        app.cleanup_ctx.append(app[SIP_KEY].serve)
    return app

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
from pathlib import Path
from typing import Any, Optional

import jinja2
from aiohttp import web

from . import echo_test, tokens
from .access import CallAccess
from .call import Call
from .config import ENGINE_MODES, Config
from .engine_host import EngineHost
from .errors import ApiError, error_response
from .ice import bind_media_ports, parse_port_range
from .loop_monitor import percentiles
from .metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from .metrics import run_sampler
from .pacer import FRAME_MS
from .registry import CallRegistry
from .sdp import MAX_SDP_BYTES, SdpError
from .warmup import WarmUp, WarmUpFn

log = logging.getLogger("parley.app")

ROOT = Path(__file__).resolve().parent.parent
MAX_BODY_BYTES = MAX_SDP_BYTES  # 64 KiB for JSON and SDP bodies alike
CONFIG_KEY = web.AppKey("config", Config)
CALLS_KEY = web.AppKey("calls", CallRegistry)
WARMUP_KEY = web.AppKey("warmup", WarmUp)
ENGINE_KEY = web.AppKey("engine", EngineHost)
SIP_KEY = web.AppKey("sip", "SipAgent")
ACCESS_KEY = web.AppKey("access", CallAccess)
CLIENT_CLOSED_STATUS = 499  # the metrics' status for a request the client abandoned (nginx's convention)
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
                       last_seq: int = 0, flow: Optional[str] = None) -> tuple[Call, str]:
    registry = request.app[CALLS_KEY]
    if registry.draining:
        peer = await registry.nodes.ready_peer(registry.config.node_id)
        if peer is not None:
            raise web.HTTPTemporaryRedirect(peer.url.rstrip("/") + request.path_qs)
        raise ApiError(503, "draining", "this node is draining", {"Retry-After": str(registry.config.retry_after_s)})
    registry.reserve()
    try:
        return await registry.open(offer_sdp, session_id, last_seq, flow=flow)
    except SdpError as exc:
        raise ApiError(400, "invalid_sdp", str(exc)) from None


# -- handlers ---------------------------------------------------------------------------------

async def create_call(request: web.Request) -> web.Response:
    config = request.app[CONFIG_KEY]
    payload = parse_offer_json(await read_body(request, "application/json"))
    session_id = resumed_session(payload, config)
    flow = request.app[ACCESS_KEY].admit_call(request, resuming=session_id is not None)
    call, answer = await answer_offer(request, payload["sdp"], session_id, last_seq_of(payload), flow)
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
    flow = request.app[ACCESS_KEY].admit_call(request, resuming=False)
    call, answer = await answer_offer(request, offer, flow=flow)
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
        tasks = [loop.create_task(run_sampler(registry.metrics, registry.calls, registry.loop_lag)),
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

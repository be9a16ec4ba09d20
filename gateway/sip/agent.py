"""Parley's SIP user agent: one UDP socket, answering calls from phones and PBXs.

    datagram ─► allowed source? ─► parse (400 or drop) ─► response: its client transaction
                                                        └► request: retransmission? its server transaction
                                                                    new: INVITE ─► admission ─► CallLeg + SipCall
                                                                         in a dialog ─► its CallLeg
                                                                         OPTIONS, CANCEL, others here

A call is admitted like a WebRTC one (the CallRegistry's slots, the engine's admission,
not while warming up or draining) and, on top, at most sip_max_calls at once. Refusals are
486 Busy Here (sip_max_calls reached) or 503 with Retry-After (warming up, draining, no
engine capacity); /metrics counts every INVITE by outcome (parley_sip_calls_total).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import json
import logging
import socket
from typing import TYPE_CHECKING, Callable, Optional

from ..errors import ApiError  # the API refusal the registry raises
from ..ice import parse_port_range
from ..sdp import SdpError as WebRtcSdpError
from .call import SipCall
from .dialog import ACCEPT, ALLOW, response_to
from .leg import CallLeg, _reason
from .message import Request, Response, SipParseError, header_params, parse
from .registration import Registration
from .sdp import SdpError
from .settings import allowed_networks
from .transaction import Address, ServerTransaction, Timers, TransactionLayer

if TYPE_CHECKING:
    from aiohttp import web

    from ..registry import CallRegistry
    from ..config import Config
    from ..warmup import WarmUp

log = logging.getLogger("parley.sip")

KEEPALIVE = (b"\r\n", b"\r\n\r\n")  # RFC 5626 keep-alives: not messages, not answered
SIP_USER = "parley"
EventListener = Callable[[SipCall, dict], None]


class SipAgent(asyncio.DatagramProtocol):
    def __init__(self, config: "Config", registry: "CallRegistry", warmup: "WarmUp") -> None:
        self.config, self.registry, self.warmup = config, registry, warmup
        self.metrics = registry.metrics
        self.timers = Timers(t1=config.sip_t1_ms / 1000)
        self.transactions = TransactionLayer(self.send, self.timers)
        self._networks = allowed_networks(config.sip_allowed_networks)
        self._host = config.sip_host or config.host
        self._port_range = parse_port_range(config.media_ports) if config.media_ports else None
        self.legs: dict[str, CallLeg] = {}  # by Call-ID
        self.event_listeners: list[EventListener] = []  # every SIP call's events (tests, operators' hooks)
        self._transport: Optional[asyncio.DatagramTransport] = None
        self.port = 0
        self.registration: Optional[Registration] = None

    # -- lifecycle --------------------------------------------------------------------------

    async def serve(self, app: "web.Application"):
        """aiohttp cleanup context: listen while the app runs."""
        await self.start()
        yield
        await self.stop()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._transport, _ = await loop.create_datagram_endpoint(lambda: self, local_addr=(self._host, self.config.sip_port))
        self.port = self._transport.get_extra_info("sockname")[1]
        log.info("SIP listening", extra={"host": self._host, "port": self.port, "max_calls": self.config.sip_max_calls})
        if self.config.sip_registrar:
            self.registration = Registration(self, self.config)
            self.registration.start()

    async def stop(self) -> None:
        if self.registration is not None:
            await self.registration.stop()
        if self._transport is not None:
            self._transport.close()

    # -- addresses ------------------------------------------------------------------------

    def local_address(self, peer: Address) -> str:
        """The address a peer reaches Parley at: sip_address, the bound one, or the local
        address of the route to the peer."""
        if self.config.sip_address:
            return self.config.sip_address
        if self._host not in ("", "0.0.0.0", "::"):
            return self._host
        with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_DGRAM)) as probe:
            probe.connect((peer[0], peer[1] or 5060))
            return probe.getsockname()[0]

    def sent_by(self, peer: Address) -> str:
        return f"{self.local_address(peer)}:{self.port}"

    def contact_uri(self, peer: Address) -> str:
        return f"sip:{SIP_USER}@{self.sent_by(peer)}"

    # -- transport --------------------------------------------------------------------------

    def send(self, data: bytes, destination: Address) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.sendto(data, destination)

    def datagram_received(self, data: bytes, addr) -> None:
        source = (addr[0], addr[1])
        if not self._allowed(source[0]):
            self.metrics.sip_ignored.labels(reason="not_allowed").inc()
            return
        if data in KEEPALIVE:
            return
        try:
            message = parse(data)
        except SipParseError as exc:
            self._reject_malformed(data, source, exc)
            return
        try:
            if isinstance(message, Response):
                self.transactions.on_response(message)
            else:
                self._on_request(message, source)
        except Exception:  # one bad call must never take the agent down
            log.exception("SIP request handling failed", extra={"call_id": message.call_id})

    def _allowed(self, host: str) -> bool:
        try:
            address = ipaddress.ip_address(host.split("%")[0])
        except ValueError:
            return False
        return any(address in network for network in self._networks)

    def _reject_malformed(self, data: bytes, source: Address, exc: SipParseError) -> None:
        """RFC 3261 16.3/8.2: answer 400 when the request is readable enough to answer; else drop."""
        self.metrics.sip_ignored.labels(reason="malformed").inc()
        salvaged = salvage_request(data)
        if salvaged is not None:
            self.send(response_to(salvaged, 400, _reason(exc), source=source).to_bytes(), source)

    # -- requests ---------------------------------------------------------------------------

    def _on_request(self, request: Request, source: Address) -> None:
        existing = self.transactions.match_server(request)
        if existing is not None:
            existing.on_retransmission(request)
            return
        if request.method == "ACK":
            leg = self.legs.get(request.call_id)
            if leg is not None:
                leg.on_ack()
            return
        transaction = self.transactions.new_server(request, source)
        if request.method == "CANCEL":
            return self._on_cancel(request, transaction, source)
        to_tag = header_params(request.headers.get("to") or "").get("tag")
        if to_tag:
            leg = self.legs.get(request.call_id)
            if leg is None or leg.dialog.local_tag != to_tag:
                return self._answer(request, transaction, source, 481)
            return leg.on_request(request, transaction)
        if request.method == "INVITE":
            asyncio.get_running_loop().create_task(self._on_invite(request, transaction, source))
        elif request.method == "OPTIONS":
            self._answer(request, transaction, source, 200, {"Allow": ALLOW, "Accept": ACCEPT})
        elif request.method in ("REGISTER", "SUBSCRIBE", "PUBLISH", "MESSAGE", "REFER"):
            self._answer(request, transaction, source, 405, {"Allow": ALLOW})
        elif request.method in ("BYE", "INFO", "NOTIFY", "UPDATE", "PRACK"):
            self._answer(request, transaction, source, 481)  # these need a dialog, and there is none
        else:
            self._answer(request, transaction, source, 501, {"Allow": ALLOW})

    def _answer(self, request: Request, transaction: ServerTransaction, source: Address, status: int,
                headers: Optional[dict[str, str]] = None, reason: str = "") -> None:
        response = response_to(request, status, reason, to_tag="parley" if status > 100 else None, source=source)
        for name, value in (headers or {}).items():
            response.headers.add(name, value)
        transaction.respond(response)

    def _on_cancel(self, cancel: Request, transaction: ServerTransaction, source: Address) -> None:
        invite = self.transactions.invite_for_cancel(cancel)
        leg = self.legs.get(cancel.call_id)
        if invite is None or invite.final:
            return self._answer(cancel, transaction, source, 481)
        self._answer(cancel, transaction, source, 200)
        if leg is not None:
            leg.cancelled = True
            leg.respond(invite.request, invite, 487)
        else:
            self._answer(invite.request, invite, source, 487)
        self.metrics.sip_calls.labels(outcome="cancelled").inc()

    async def _on_invite(self, invite: Request, transaction: ServerTransaction, source: Address) -> None:
        transaction.respond(response_to(invite, 100, source=source))
        refusal = self._refusal(invite)
        if refusal is not None:
            status, outcome, headers = refusal
            self.metrics.sip_calls.labels(outcome=outcome).inc()
            return self._answer(invite, transaction, source, status, headers)
        leg = CallLeg(self, invite, transaction, source)
        self.legs[invite.call_id] = leg
        try:
            await self._connect(leg)
        finally:
            if leg.call is None:
                self.legs.pop(invite.call_id, None)

    def _refusal(self, invite: Request) -> Optional[tuple[int, str, dict[str, str]]]:
        retry = {"Retry-After": str(self.config.retry_after_s)}
        if invite.call_id in self.legs:
            return 482, "failed", {}  # a second INVITE of a call already here: a loop or a fork
        if invite.content_type != "application/sdp" or not invite.body:
            return 488, "not_acceptable", {"Accept": "application/sdp", "Warning": '399 parley "an SDP offer is needed"'}
        if not self.warmup.ready or self.registry.draining:
            return 503, "unavailable", retry
        if len(self.legs) >= self.config.sip_max_calls:
            return 486, "busy", retry
        return None

    async def _connect(self, leg: CallLeg) -> None:
        invite, transaction = leg.invite, leg.transaction
        leg.respond(invite, transaction, 180)
        try:
            self.registry.reserve()
        except ApiError as exc:
            self.metrics.sip_calls.labels(outcome="busy" if exc.status == 429 else "unavailable").inc()
            return leg.respond(invite, transaction, 486 if exc.status == 429 else 503,
                               headers={"Retry-After": str(self.config.retry_after_s)})
        make_call = functools.partial(SipCall, signaling=leg, caller=leg.source, host=self._host,
                                      advertised=self.local_address(leg.source), port_range=self._port_range,
                                      on_event=self._on_call_event)
        try:
            call, answer = await self.registry.open(invite.body.decode("utf-8", "replace"), None, 0, make_call)
        except (SdpError, WebRtcSdpError) as exc:
            self.metrics.sip_calls.labels(outcome="not_acceptable").inc()
            return leg.respond(invite, transaction, 488, _reason(exc))
        except ApiError as exc:
            self.metrics.sip_calls.labels(outcome="unavailable").inc()
            return leg.respond(invite, transaction, 503, _reason(exc), headers={"Retry-After": str(self.config.retry_after_s)})
        except Exception:
            log.exception("SIP call set-up failed", extra={"call_id": invite.call_id})
            self.metrics.sip_calls.labels(outcome="failed").inc()
            return leg.respond(invite, transaction, 500, "the gateway could not set up the call")
        leg.call = call
        if leg.cancelled:  # the caller gave up while the call was being set up
            await call.close("cancelled")
        else:
            leg.respond(invite, transaction, 200, sdp=answer)
        asyncio.get_running_loop().create_task(self._count_when_closed(leg, call))

    async def _count_when_closed(self, leg: CallLeg, call: SipCall) -> None:
        await call.closed.wait()
        if call.close_reason != "cancelled":  # (counted when the CANCEL came)
            self.metrics.sip_calls.labels(outcome=call.close_reason or "unknown").inc()
        if self.legs.get(leg.dialog.call_id) is leg:
            del self.legs[leg.dialog.call_id]

    def _on_call_event(self, call: SipCall, text: str) -> None:
        if self.event_listeners:
            event = json.loads(text)
            for listener in list(self.event_listeners):
                listener(call, event)


def salvage_request(data: bytes) -> Optional[Request]:
    """The headers a 400 needs (Via, From, To, Call-ID, CSeq) from a request that did not
    parse, or None when even those are missing (then the datagram is dropped)."""
    try:
        head = data.split(b"\r\n\r\n", 1)[0].decode("utf-8")
    except UnicodeDecodeError:
        return None
    lines = head.split("\r\n")
    first = lines[0].split(" ")
    if len(first) != 3 or first[2] != "SIP/2.0" or not first[0].isalpha():
        return None  # a response, or not SIP at all: never answered
    request = Request(method=first[0].upper(), uri=first[1])
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep and name.strip():
            request.headers.add(name, value)
    if not all(name in request.headers for name in ("via", "from", "to", "call-id", "cseq")):
        return None
    return request

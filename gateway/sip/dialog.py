"""A SIP dialog as the answering side (RFC 3261 section 12): its identity, CSeq counters
and the requests Parley sends inside it (BYE, REFER), and the 2xx it repeats until ACKed.

In-dialog requests go back to where the caller's INVITE came from (its source address,
as RFC 3581's rport does for responses), not to its Contact: a PBX or a phone behind NAT
is reached where it sent from.
"""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass, field
from typing import Callable, Optional

from .message import Request, Response, address_uri, header_params
from .transaction import Address, Timers, new_branch

ALLOW = "INVITE, ACK, BYE, CANCEL, OPTIONS, INFO, REFER, NOTIFY, UPDATE"
ACCEPT = "application/sdp, application/dtmf-relay, application/dtmf, message/sipfrag"
USER_AGENT = "Parley"


def new_tag() -> str:
    return secrets.token_hex(6)


def response_to(request: Request, status: int, reason: str = "", to_tag: Optional[str] = None,
                source: Optional[Address] = None) -> Response:
    """A response with the request's Via, From, To (plus our tag), Call-ID and CSeq (RFC 3261 8.2.6.2).
    The top Via gets `received` and `rport` filled in (RFC 3581), so the answer finds a NATed peer."""
    response = Response(status=status, reason=reason)
    for index, via in enumerate(request.headers.get_all("via")):
        if index == 0 and source is not None:
            via = _stamp_via(via, source)
        response.headers.add("via", via)
    to = request.headers.get("to") or ""
    if to_tag and "tag" not in header_params(to):
        to = f"{to};tag={to_tag}"
    for name, value in (("from", request.headers.get("from")), ("to", to), ("call-id", request.call_id),
                        ("cseq", request.headers.get("cseq"))):
        response.headers.add(name, value or "")
    response.headers.add("server", USER_AGENT)
    return response


def _stamp_via(via: str, source: Address) -> str:
    parts = via.split(";")
    stamped = []
    for part in parts[1:]:
        if part.strip().lower() == "rport":
            part = f"rport={source[1]}"
        stamped.append(part)
    if source[0] not in parts[0]:
        stamped.append(f"received={source[0]}")
    return ";".join([parts[0]] + stamped)


@dataclass
class Dialog:
    call_id: str
    local_tag: str
    remote_tag: str
    local_party: str  # the INVITE's To header without tag: who Parley is in this call
    remote_party: str  # the INVITE's From header without tag
    remote_target: str  # the caller's Contact URI
    route_set: list[str]
    remote_seq: int
    peer: Address  # where Parley's requests in this dialog go
    local_contact: str  # Parley's Contact URI
    via_sent_by: str  # host:port Parley puts in its Via
    local_seq: int = field(default_factory=lambda: secrets.randbelow(1 << 16) + 1)

    @classmethod
    def from_invite(cls, invite: Request, source: Address, local_contact: str, via_sent_by: str) -> "Dialog":
        contact = invite.headers.get_all("contact")
        route_set = invite.headers.get_all("record-route")
        return cls(call_id=invite.call_id, local_tag=new_tag(),
                   remote_tag=header_params(invite.headers.get("from") or "").get("tag", ""),
                   local_party=_without_tag(invite.headers.get("to") or ""),
                   remote_party=_without_tag(invite.headers.get("from") or ""),
                   remote_target=address_uri(contact[0]) if contact else address_uri(invite.headers.get("from") or ""),
                   route_set=route_set, remote_seq=invite.cseq[0], peer=source,
                   local_contact=local_contact, via_sent_by=via_sent_by)

    def request(self, method: str, extra: Optional[dict[str, str]] = None, body: bytes = b"",
                content_type: str = "") -> Request:
        """A new request inside this dialog (RFC 3261 12.2.1.1)."""
        self.local_seq += 1
        request = Request(method=method, uri=self.remote_target)
        request.headers.add("via", f"SIP/2.0/UDP {self.via_sent_by};branch={new_branch()};rport")
        request.headers.add("max-forwards", "70")
        request.headers.add("from", f"{self.local_party};tag={self.local_tag}")
        request.headers.add("to", f"{self.remote_party};tag={self.remote_tag}" if self.remote_tag else self.remote_party)
        request.headers.add("call-id", self.call_id)
        request.headers.add("cseq", f"{self.local_seq} {method}")
        for route in self.route_set:  # Record-Route order is already the callee's route order
            request.headers.add("route", route)
        request.headers.add("contact", f"<{self.local_contact}>")
        request.headers.add("user-agent", USER_AGENT)
        for name, value in (extra or {}).items():
            request.headers.add(name, value)
        if content_type:
            request.headers.add("content-type", content_type)
        request.body = body
        return request


def _without_tag(header: str) -> str:
    return ";".join(part for part in header.split(";") if not part.strip().lower().startswith("tag="))


class Reliable2xx:
    """Repeats a 2xx to INVITE until its ACK (RFC 3261 13.3.1.4): T1, doubling up to T2,
    for 64*T1; then the call is given up (`on_timeout`), as the caller never confirmed it."""

    def __init__(self, response: Response, send: Callable[[], None], timers: Timers,
                 on_timeout: Callable[[], None]) -> None:
        self.response = response
        self._send = send
        self._timers = timers
        self._on_timeout = on_timeout
        self._interval = timers.t1
        self.acked = asyncio.Event()
        loop = asyncio.get_running_loop()
        self._handles = [loop.call_later(self._interval, self._repeat),
                         loop.call_later(timers.timeout, self._give_up)]

    def _repeat(self) -> None:
        if self.acked.is_set():
            return
        self._send()
        self._interval = min(2 * self._interval, self._timers.t2)
        self._handles.append(asyncio.get_running_loop().call_later(self._interval, self._repeat))

    def _give_up(self) -> None:
        if not self.acked.is_set():
            self.stop()
            self._on_timeout()

    def ack(self) -> None:
        self.acked.set()
        self.stop()

    def stop(self) -> None:
        for handle in self._handles:
            handle.cancel()
        self._handles.clear()

"""One inbound call's signalling: the INVITE answered (100, 180, 200 with SDP, repeated
until ACK), requests inside its dialog (re-INVITE, UPDATE, BYE, INFO, NOTIFY), and the
requests Parley sends in it (BYE, and a blind transfer: REFER, then NOTIFYs until the
transfer target's final answer).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Optional

from .dialog import ACCEPT, ALLOW, Dialog, Reliable2xx, response_to
from .dtmf import INFO_TYPES, DtmfError, parse_info
from .message import Request, Response
from .sdp import SdpError
from .transaction import Address, ServerTransaction, TransactionTimeout

if TYPE_CHECKING:
    from .agent import SipAgent
    from .call import SipCall

log = logging.getLogger("parley.sip")

REFER_TIMEOUT_S = 30.0  # how long a transfer target may ring before the transfer counts as failed
SIPFRAG_PREFIX = "SIP/2.0 "


class CallLeg:
    """Implements gateway/sip/call.py's SipSignaling for its SipCall."""

    def __init__(self, agent: "SipAgent", invite: Request, transaction: ServerTransaction, source: Address) -> None:
        self.agent = agent
        self.invite = invite
        self.transaction = transaction
        self.source = source
        self.dialog = Dialog.from_invite(invite, source, agent.contact_uri(source), agent.sent_by(source))
        self.call: Optional["SipCall"] = None
        self.cancelled = False
        self._pending_2xx: Optional[Reliable2xx] = None
        self._transfer_status: asyncio.Queue[int] = asyncio.Queue()

    def respond(self, request: Request, transaction: ServerTransaction, status: int, reason: str = "",
                sdp: str = "", headers: Optional[dict[str, str]] = None) -> Response:
        response = response_to(request, status, reason, self.dialog.local_tag if status > 100 else None, self.source)
        if 200 <= status < 300 and request.method in ("INVITE", "UPDATE"):
            response.headers.add("contact", f"<{self.dialog.local_contact}>")
            response.headers.add("allow", ALLOW)
            _echo_session_timer(request, response)
        for name, value in (headers or {}).items():
            response.headers.add(name, value)
        if sdp:
            response.headers.add("content-type", "application/sdp")
            response.body = sdp.encode()
        transaction.respond(response)
        if 200 <= status < 300 and request.method == "INVITE":
            self._repeat_until_ack(response)
        return response

    def _repeat_until_ack(self, response: Response) -> None:
        if self._pending_2xx is not None:
            self._pending_2xx.stop()
        data = response.to_bytes()
        self._pending_2xx = Reliable2xx(response, lambda: self.agent.send(data, self.source), self.agent.timers,
                                        self._no_ack)

    def on_ack(self) -> None:
        if self._pending_2xx is not None:
            self._pending_2xx.ack()

    def _no_ack(self) -> None:
        if self.call is not None:
            asyncio.get_running_loop().create_task(self.call.close("no_ack"))

    # -- in-dialog requests from the caller ------------------------------------------------

    def on_request(self, request: Request, transaction: ServerTransaction) -> None:
        if request.cseq[0] < self.dialog.remote_seq and request.method != "ACK":
            return self.respond(request, transaction, 500, "CSeq out of order")
        self.dialog.remote_seq = max(self.dialog.remote_seq, request.cseq[0])
        if request.method == "BYE":
            self.respond(request, transaction, 200)
            if self.call is not None:
                self.call.remote_hangup()
            else:
                self.cancelled = True
        elif self.call is None:
            self.respond(request, transaction, 491, "Request Pending", headers={"Retry-After": "1"})
        elif request.method in ("INVITE", "UPDATE"):
            self._on_reoffer(request, transaction)
        elif request.method == "INFO":
            self._on_info(request, transaction)
        elif request.method == "NOTIFY":
            self._on_notify(request, transaction)
        elif request.method == "OPTIONS":
            self.respond(request, transaction, 200, headers={"Allow": ALLOW, "Accept": ACCEPT})
        else:
            self.respond(request, transaction, 501, headers={"Allow": ALLOW})

    def _on_reoffer(self, request: Request, transaction: ServerTransaction) -> None:
        """Hold, unhold or a session refresh; an UPDATE without SDP only refreshes the session."""
        if not request.body and request.method == "UPDATE":
            return self.respond(request, transaction, 200)
        if request.content_type != "application/sdp":
            return self.respond(request, transaction, 488, "Parley needs an SDP offer in the re-INVITE")
        try:
            answer = self.call.reoffer(request.body.decode("utf-8", "replace"))
        except SdpError as exc:
            return self.respond(request, transaction, 488, _reason(exc))
        self.respond(request, transaction, 200, sdp=answer)

    def _on_info(self, request: Request, transaction: ServerTransaction) -> None:
        if not request.body:
            return self.respond(request, transaction, 200)  # an INFO keep-alive
        if request.content_type not in INFO_TYPES:
            return self.respond(request, transaction, 415, headers={"Accept": ", ".join(INFO_TYPES)})
        try:
            digit = parse_info(request.content_type, request.body)
        except DtmfError as exc:
            return self.respond(request, transaction, 400, _reason(exc))
        self.respond(request, transaction, 200)
        self.call.on_digit(digit, "info")

    def _on_notify(self, request: Request, transaction: ServerTransaction) -> None:
        event = (request.headers.get("event") or "").split(";")[0].strip().lower()
        if event != "refer":
            return self.respond(request, transaction, 489, "Bad Event")
        self.respond(request, transaction, 200)
        status = _sipfrag_status(request.body.decode("utf-8", "replace"))
        terminated = (request.headers.get("subscription-state") or "").lower().startswith("terminated")
        if status is not None:
            self._transfer_status.put_nowait(status)
        elif terminated:
            self._transfer_status.put_nowait(0)  # ended without saying how: not a success

    # -- SipSignaling ----------------------------------------------------------------------

    async def bye(self) -> None:
        response = await self.agent.transactions.request(self.dialog.request("BYE"), self.dialog.peer)
        if response.status >= 300:
            log.info("BYE refused", extra={"call_id": self.dialog.call_id, "status": response.status})

    async def refer(self, target: str) -> bool:
        """A blind transfer (RFC 3515): True once the target answered the caller (a 2xx sipfrag)."""
        request = self.dialog.request("REFER", {"Refer-To": f"<{target}>",
                                                "Referred-By": f"<{self.dialog.local_contact}>"})
        try:
            response = await self.agent.transactions.request(request, self.dialog.peer)
        except TransactionTimeout:
            return False
        if not 200 <= response.status < 300:
            log.info("REFER refused", extra={"call_id": self.dialog.call_id, "status": response.status})
            return False
        try:
            async with asyncio.timeout(REFER_TIMEOUT_S):
                while True:
                    status = await self._transfer_status.get()
                    if status == 0 or status >= 200:
                        return 200 <= status < 300
        except TimeoutError:
            return False


def _sipfrag_status(body: str) -> Optional[int]:
    line = body.strip().splitlines()[0] if body.strip() else ""
    code = line[len(SIPFRAG_PREFIX):len(SIPFRAG_PREFIX) + 3] if line.startswith(SIPFRAG_PREFIX) else ""
    return int(code) if code.isdigit() else None


def _echo_session_timer(request: Request, response: Response) -> None:
    """Tolerate session timers (RFC 4028): accept the interval and leave refreshing to the caller."""
    expires = request.headers.get("session-expires")
    if expires is None:
        return
    interval = expires.split(";")[0].strip()
    response.headers.add("session-expires", f"{interval};refresher=uac")
    if "timer" in (request.headers.get("supported") or "") + (request.headers.get("require") or ""):
        response.headers.add("require", "timer")


def _reason(exc: Exception) -> str:
    """An exception's text as a reason phrase: one line, no control characters."""
    return " ".join(str(exc).split())[:120]

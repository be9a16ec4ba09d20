"""SIP transactions over UDP (RFC 3261 section 17): retransmissions and timers.

UDP loses datagrams, so each side repeats itself until the other answers:

- a client transaction (a request Parley sends: BYE, REFER, NOTIFY's answer, REGISTER)
  retransmits its request — timer A for INVITE, E for others, doubling from T1 — until a
  response comes, and gives up after 64*T1 (timer B for INVITE, F for others);
- a server transaction (a request Parley receives) answers a retransmitted request with its
  last response instead of acting twice; an INVITE's non-2xx final response is repeated
  (timer G) until the ACK, for at most 64*T1 (timer H); a non-INVITE transaction keeps its
  response for 64*T1 (timer J) to absorb late retransmissions.

A 2xx to INVITE is not the transaction's to repeat (RFC 3261 13.3.1.4: the dialog does it,
gateway/sip/dialog.py), because its ACK is a request of its own, outside the transaction.
"""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass
from typing import Any, Callable, Optional

from .message import BRANCH_MAGIC, Request, Response, header_params

Address = tuple[str, int]
Send = Callable[[bytes, Address], None]


@dataclass(frozen=True)
class Timers:
    """RFC 3261's base timers in seconds (section 17.1.1.1); tests shrink them."""

    t1: float = 0.5  # round-trip estimate: the first retransmission interval
    t2: float = 4.0  # cap on the non-INVITE retransmission interval
    t4: float = 5.0  # how long a message may linger in the network

    @property
    def timeout(self) -> float:
        """64*T1: timers B, F, H and J."""
        return 64 * self.t1


class TransactionTimeout(Exception):
    """No final response within 64*T1 (timer B or F fired)."""


def new_branch() -> str:
    return BRANCH_MAGIC + secrets.token_hex(8)


def server_key(request: Request) -> tuple[str, str, str]:
    """RFC 3261 17.2.3: branch, sent-by and method; an ACK matches its INVITE."""
    via = request.top_via
    sent_by = via.split(";")[0].split()[-1] if via else ""
    method = "INVITE" if request.method == "ACK" else request.method
    return request.branch, sent_by.lower(), method


class _Transaction:
    """What both kinds share: the request, where it goes or came from, and the timers."""

    def __init__(self, request: Request, peer: Address, send: Send, timers: Timers,
                 on_terminated: Callable[[Any], None]) -> None:
        self.request = request
        self.peer = peer
        self.invite = request.method == "INVITE"
        self._send = send
        self._timers = timers
        self._on_terminated = on_terminated
        self._interval = timers.t1
        self._handles: list[asyncio.TimerHandle] = []

    def _later(self, delay: float, callback: Callable[[], None]) -> None:
        self._handles.append(asyncio.get_running_loop().call_later(delay, callback))

    def _cancel_timers(self) -> None:
        for handle in self._handles:
            handle.cancel()
        self._handles.clear()


class ServerTransaction(_Transaction):
    """One received request: answers its retransmissions, repeats a non-2xx INVITE answer."""

    def __init__(self, request: Request, source: Address, send: Send, timers: Timers,
                 on_terminated: Callable[["ServerTransaction"], None]) -> None:
        super().__init__(request, source, send, timers, on_terminated)
        self.last_response: Optional[Response] = None
        self.state = "proceeding" if self.invite else "trying"

    @property
    def final(self) -> bool:
        return self.last_response is not None and self.last_response.status >= 200

    def respond(self, response: Response) -> None:
        if self.state in ("completed", "confirmed", "terminated"):
            return  # a final answer was given already; later ones are the caller's mistake
        self.last_response = response
        self._send(response.to_bytes(), self.peer)
        if response.status < 200:
            self.state = "proceeding"
        elif self.invite and response.status < 300:
            self._terminate()  # the dialog repeats a 2xx until its ACK
        elif self.invite:
            self.state = "completed"
            self._later(self._interval, self._timer_g)
            self._later(self._timers.timeout, self._terminate)  # timer H: no ACK came
        else:
            self.state = "completed"
            self._later(self._timers.timeout, self._terminate)  # timer J

    def on_retransmission(self, request: Request) -> None:
        """The same request again (or the ACK of our non-2xx final answer)."""
        if request.method == "ACK":
            if self.state == "completed":
                self.state = "confirmed"
                self._cancel_timers()
                self._later(self._timers.t4, self._terminate)  # timer I: absorb ACK retransmissions
            return
        if self.last_response is not None:
            self._send(self.last_response.to_bytes(), self.peer)

    def _timer_g(self) -> None:
        if self.state != "completed" or self.last_response is None:
            return
        self._send(self.last_response.to_bytes(), self.peer)
        self._interval = min(2 * self._interval, self._timers.t2)
        self._later(self._interval, self._timer_g)

    def _terminate(self) -> None:
        if self.state == "terminated":
            return
        self.state = "terminated"
        self._cancel_timers()
        self._on_terminated(self)


class ClientTransaction(_Transaction):
    """One request Parley sends, retransmitted until its final response or timer B/F."""

    def __init__(self, request: Request, destination: Address, send: Send, timers: Timers,
                 on_terminated: Callable[["ClientTransaction"], None]) -> None:
        super().__init__(request, destination, send, timers, on_terminated)
        self._provisional = False
        self._final: asyncio.Future[Response] = asyncio.get_running_loop().create_future()

    @property
    def key(self) -> tuple[str, str]:
        return self.request.branch, self.request.method

    def start(self) -> None:
        self._send(self.request.to_bytes(), self.peer)
        self._later(self._interval, self._retransmit)  # timer A (INVITE) or E
        self._later(self._timers.timeout, self._timeout)  # timer B (INVITE) or F

    async def final_response(self) -> Response:
        """The final response; TransactionTimeout after 64*T1 without one."""
        return await self._final

    def on_response(self, response: Response) -> None:
        if self._final.done():
            return
        if response.status < 200:
            self._provisional = True  # a non-INVITE stops doubling at T2; an INVITE stops retransmitting
            return
        if self.invite and response.status >= 300:
            self._send(self._ack_for(response).to_bytes(), self.peer)
        self._final.set_result(response)
        self._finish()

    def _retransmit(self) -> None:
        if self._final.done() or (self.invite and self._provisional):
            return
        self._send(self.request.to_bytes(), self.peer)
        self._interval = 2 * self._interval if self.invite else min(2 * self._interval, self._timers.t2)
        self._later(self._interval, self._retransmit)

    def _timeout(self) -> None:
        if not self._final.done():
            self._final.set_exception(TransactionTimeout(f"no answer to {self.request.method} "
                                                          f"within {self._timers.timeout:g} s"))
        self._finish()

    def _ack_for(self, response: Response) -> Request:
        """RFC 3261 17.1.1.3: the ACK of a non-2xx answer belongs to the INVITE's transaction."""
        ack = Request(method="ACK", uri=self.request.uri)
        for name in ("via", "from", "call-id", "route"):
            for value in ([self.request.top_via] if name == "via" else self.request.headers.get_all(name)):
                ack.headers.add(name, value)
        ack.headers.add("to", response.headers.get("to") or "")
        ack.headers.add("cseq", f"{self.request.cseq[0]} ACK")
        ack.headers.add("max-forwards", "70")
        return ack

    def _finish(self) -> None:
        self._cancel_timers()
        self._on_terminated(self)


class TransactionLayer:
    """Matches incoming messages to live transactions (RFC 3261 17.1.3 and 17.2.3)."""

    def __init__(self, send: Send, timers: Timers) -> None:
        self.send = send
        self.timers = timers
        self.servers: dict[tuple[str, str, str], ServerTransaction] = {}
        self.clients: dict[tuple[str, str], ClientTransaction] = {}

    def match_server(self, request: Request) -> Optional[ServerTransaction]:
        return self.servers.get(server_key(request))

    def new_server(self, request: Request, source: Address) -> ServerTransaction:
        transaction = ServerTransaction(request, source, self.send, self.timers, self._server_ended)
        self.servers[server_key(request)] = transaction
        return transaction

    def invite_for_cancel(self, cancel: Request) -> Optional[ServerTransaction]:
        """The INVITE server transaction a CANCEL names (same branch and sent-by)."""
        branch, sent_by, _ = server_key(cancel)
        return self.servers.get((branch, sent_by, "INVITE"))

    def _server_ended(self, transaction: ServerTransaction) -> None:
        key = server_key(transaction.request)
        if self.servers.get(key) is transaction:
            del self.servers[key]

    async def request(self, request: Request, destination: Address) -> Response:
        """Send a request in a new client transaction and return its final response."""
        transaction = ClientTransaction(request, destination, self.send, self.timers, self._client_ended)
        self.clients[transaction.key] = transaction
        transaction.start()
        return await transaction.final_response()

    def on_response(self, response: Response) -> bool:
        """Give a response to its client transaction; False when none matches (a stray)."""
        _, method = response.cseq
        transaction = self.clients.get((header_params(response.top_via).get("branch", ""), method))
        if transaction is None:
            return False
        transaction.on_response(response)
        return True

    def _client_ended(self, transaction: ClientTransaction) -> None:
        if self.clients.get(transaction.key) is transaction:
            del self.clients[transaction.key]

"""Network impairment without root or sch_netem: a UDP relay between a caller and the
gateway that drops, delays and reorders datagrams as the netem profiles of tests/kit/netem.py
do, in both directions.

    caller (aiortc) ──► relay 127.0.0.1:<port> ──impaired──► gateway's ICE candidate
                    ◄──impaired────────────────◄──

The caller is told the relay is the gateway: `relay.rewrite_answer(sdp)` replaces the SDP
answer's candidates with the relay's one and aims the relay at the first UDP candidate it
replaced; and the gateway is told nothing true of the caller: `relay.rewrite_offer(sdp)` points
the offer's candidates at a socket of the relay's that swallows what it gets, so the gateway's
own checks cannot find a path around the relay (it learns the relay's sockets from the checks
that cross it). ICE, DTLS, SRTP and the data channel then all cross the relay, as they would cross
an impaired link. Like a NAT, the relay gives each of the caller's sockets an upstream socket
of its own, which the gateway sees as a peer-reflexive candidate, so replies reach the socket
they answer. The
models are per datagram, like netem's: random loss, a normally distributed delay (which
reorders datagrams sent closer together than its spread), and Gilbert-Elliott bursts.
"""

from __future__ import annotations

import asyncio
import random
import re
from typing import Callable, Optional

from .netem import PROFILES

CANDIDATE = re.compile(r"^a=candidate:(\S+) (\d) (udp|UDP) (\d+) (\S+) (\d+) typ (\S+)(.*)$")


class LinkModel:
    """One direction's fate for each datagram: None (lost) or the delay in seconds."""

    def __init__(self, profile: str, rng: random.Random) -> None:
        if profile not in PROFILES:
            raise ValueError(f"unknown impairment profile {profile!r}; known: {', '.join(PROFILES)}")
        self.profile, self.rng = profile, rng
        self.bad = False  # Gilbert-Elliott: in the lossy state

    def fate(self) -> Optional[float]:
        if self.profile == "loss_5pct":
            return None if self.rng.random() < 0.05 else 0.0
        if self.profile == "jitter_40ms":  # netem: delay 40ms 40ms distribution normal
            return max(0.0, self.rng.gauss(0.040, 0.040))
        if self.profile == "bursts_200ms":  # netem: loss gemodel 0.25% 10% 100% 0%
            self.bad = self.rng.random() >= 0.10 if self.bad else self.rng.random() < 0.0025
            return None if self.bad else 0.0
        return 0.0


class _Side(asyncio.DatagramProtocol):
    def __init__(self, on_datagram: Callable[[bytes, tuple], None]) -> None:
        self.on_datagram = on_datagram
        self.transport: Optional[asyncio.DatagramTransport] = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple) -> None:
        self.on_datagram(data, addr)


class ImpairedRelay:
    """A UDP relay with a LinkModel each way, each drawing from its own generator (its losses
    follow its own datagrams only)."""

    def __init__(self, profile: str = "clean", seed: int = 0) -> None:
        self.to_gateway = LinkModel(profile, random.Random(f"{seed}-to-gateway"))
        self.to_caller = LinkModel(profile, random.Random(f"{seed}-to-caller"))
        self.target: Optional[tuple[str, int]] = None  # the gateway's candidate
        self.caller_side = _Side(self._from_caller)
        self.black_hole = _Side(lambda data, addr: None)
        self.flows: dict[tuple, _Side] = {}  # a caller's socket -> its upstream socket
        self.waiting: dict[tuple, list[bytes]] = {}  # datagrams of a flow whose socket is being made
        self.counts = {"to_gateway": 0, "to_caller": 0, "dropped": 0}

    async def start(self, host: str = "127.0.0.1") -> "ImpairedRelay":
        self.host = host
        loop = asyncio.get_running_loop()
        await loop.create_datagram_endpoint(lambda: self.caller_side, local_addr=(host, 0))
        await loop.create_datagram_endpoint(lambda: self.black_hole, local_addr=(host, 0))
        return self

    @property
    def address(self) -> tuple[str, int]:
        assert self.caller_side.transport is not None, "start() the relay first"
        return self.caller_side.transport.get_extra_info("sockname")[:2]

    def rewrite_answer(self, sdp: str) -> str:
        """The answer with one host candidate, the relay's; the relay aims at the gateway's
        first UDP candidate."""
        host, port = self.address
        lines, placed = [], False
        for line in sdp.splitlines():
            match = CANDIDATE.match(line)
            if not match:
                lines.append(line)
                continue
            if self.target is None:
                self.target = (match.group(5), int(match.group(6)))
            if not placed:
                foundation, component, _, priority = match.group(1, 2, 3, 4)
                lines.append(f"a=candidate:{foundation} {component} udp {priority} {host} {port} typ host")
                placed = True
        if self.target is None:
            raise ValueError("the SDP answer has no UDP candidate to relay to")
        return "\r\n".join(lines) + "\r\n"

    def rewrite_offer(self, sdp: str) -> str:
        """The offer with its candidates pointing at the black hole: the gateway reaches the
        caller only through the relay."""
        assert self.black_hole.transport is not None, "start() the relay first"
        host, port = self.black_hole.transport.get_extra_info("sockname")[:2]
        return "\r\n".join(CANDIDATE.sub(lambda m: (f"a=candidate:{m.group(1)} {m.group(2)} udp {m.group(4)} "
                                                      f"{host} {port} typ host"), line)
                            for line in sdp.splitlines()) + "\r\n"

    def _from_caller(self, data: bytes, addr: tuple) -> None:
        if self.target is None:
            return
        if addr in self.flows:
            self._forward(self.to_gateway, self.flows[addr], data, self.target, "to_gateway")
        elif addr in self.waiting:
            self.waiting[addr].append(data)
        else:
            self.waiting[addr] = [data]
            asyncio.get_running_loop().create_task(self._open_flow(addr))

    async def _open_flow(self, caller: tuple) -> None:
        upstream = _Side(lambda data, _: self._forward(self.to_caller, self.caller_side, data, caller, "to_caller"))
        await asyncio.get_running_loop().create_datagram_endpoint(lambda: upstream, local_addr=(self.host, 0))
        self.flows[caller] = upstream
        for data in self.waiting.pop(caller):
            self._from_caller(data, caller)

    def _forward(self, model: LinkModel, side: _Side, data: bytes, to: tuple, count: str) -> None:
        delay = model.fate()
        if delay is None:
            self.counts["dropped"] += 1
            return
        self.counts[count] += 1
        if delay <= 0:
            self._send(side, data, to)
        else:
            asyncio.get_running_loop().call_later(delay, self._send, side, data, to)

    @staticmethod
    def _send(side: _Side, data: bytes, to: tuple) -> None:
        if side.transport is not None and not side.transport.is_closing():
            side.transport.sendto(data, to)

    def close(self) -> None:
        for side in (self.caller_side, self.black_hole, *self.flows.values()):
            if side.transport is not None:
                side.transport.close()

"""One SIP call's media: a UDP RTP/RTCP port pair, G.711 both ways, DTMF in.

Inbound RTP goes into the call's Playout (gateway/playout.py: Parley's adaptive jitter
buffer, pulled every 20 ms) through a G.711 decoder, or to the DTMF detector when it
carries telephone-events. Outbound, the call's PacedAudioTrack (gateway/pacer.py, built
with a G.711 encoder) sets the pace: each frame it yields becomes one RTP packet. RTP is
symmetric (RFC 4961): Parley sends from the port it receives on, and once the caller's
packets arrive it answers to where they come from, which gets through a NAT that rewrote
the SDP's address. A sender report goes out every RTCP_INTERVAL_S.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import random
import secrets
import time
from typing import Callable, Optional

from ..pacer import PacedAudioTrack
from ..playout import Playout
from .dtmf import DtmfError, PressDetector
from .g711 import WIRE_FRAME_SAMPLES
from .rtp import RtpError, RtpPacket, is_rtcp, parse_rtp, sender_report
from .sdp import AudioOffer

log = logging.getLogger("parley.sip.media")

RTCP_INTERVAL_S = 5.0  # RFC 3550's minimum report interval for a two-party session
PORT_ATTEMPTS = 50  # tries for a free even/odd pair before giving up

Address = tuple[str, int]
DigitSink = Callable[[str, str], None]  # (digit, "rfc4733" | "info")


class _Endpoint(asyncio.DatagramProtocol):
    def __init__(self, on_datagram: Optional[Callable[[bytes, Address], None]]) -> None:
        self.on_datagram = on_datagram
        self.transport: Optional[asyncio.DatagramTransport] = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr) -> None:
        if self.on_datagram is not None:  # (None until the RtpSession that owns the port takes it)
            self.on_datagram(data, (addr[0], addr[1]))


async def bind_pair(host: str, port_range: Optional[tuple[int, int]], on_rtp, on_rtcp) -> tuple[_Endpoint, _Endpoint]:
    """An even RTP port and the odd RTCP port above it (RFC 3550 11), from `port_range` if given."""
    loop = asyncio.get_running_loop()
    for _ in range(PORT_ATTEMPTS):
        if port_range:
            port = random.randrange(port_range[0] + port_range[0] % 2, port_range[1], 2)
        else:
            port = random.randrange(20000, 60000, 2)
        try:
            _, rtp = await loop.create_datagram_endpoint(lambda: _Endpoint(on_rtp), local_addr=(host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                continue
            raise
        try:
            _, rtcp = await loop.create_datagram_endpoint(lambda: _Endpoint(on_rtcp), local_addr=(host, port + 1))
        except OSError as exc:
            rtp.transport.close()
            if exc.errno == errno.EADDRINUSE:
                continue
            raise
        return rtp, rtcp
    raise OSError(errno.EADDRINUSE, "no free RTP/RTCP port pair" + (f" in {port_range}" if port_range else ""))


class RtpSession:
    """RTP in and out for one call; `start` once the answer is sent, `close` at hang-up."""

    def __init__(self, rtp: _Endpoint, rtcp: _Endpoint, playout: Playout, pacer: PacedAudioTrack,
                 on_digit: DigitSink, signaling_ip: str) -> None:
        self.signaling_ip = signaling_ip
        self._rtp, self._rtcp = rtp, rtcp
        rtp.on_datagram, rtcp.on_datagram = self._on_rtp, self._on_rtcp
        self._playout = playout
        self._hook = playout.attach_source()
        self._pacer = pacer
        self._on_digit = on_digit
        self._presses = PressDetector()
        self.offer: Optional[AudioOffer] = None
        self._remote: Optional[Address] = None
        self._remote_rtcp: Optional[Address] = None
        self._latched = False
        self.ssrc = secrets.randbits(32)
        self._seq = secrets.randbits(16)
        self._timestamp = secrets.randbits(32)
        self.packets_sent = self.octets_sent = 0
        self.packets_received = self.packets_ignored = 0
        self._sending = asyncio.Event()  # cleared while the caller holds the call
        self._tasks: list[asyncio.Task] = []

    @property
    def port(self) -> int:
        return self._rtp.transport.get_extra_info("sockname")[1]

    def apply(self, offer: AudioOffer) -> None:
        """The caller's (new) offer: where to send, and whether they hold the call."""
        self.offer = offer
        if not self._latched:
            self._remote = (offer.address, offer.port)
            self._remote_rtcp = (offer.address, offer.rtcp_port)
        if offer.on_hold:
            self._sending.clear()
        else:
            self._sending.set()

    @property
    def on_hold(self) -> bool:
        return not self._sending.is_set()

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._send_loop()), loop.create_task(self._report_loop())]

    # -- inbound --------------------------------------------------------------------------

    def _on_rtp(self, data: bytes, source: Address) -> None:
        if is_rtcp(data):  # a peer multiplexing RTCP on the RTP port (RFC 5761)
            return
        if self.offer is None or source[0] not in self._allowed_sources():
            self.packets_ignored += 1  # media from somebody who is not in this call
            return
        try:
            packet = parse_rtp(data)
        except RtpError:
            self.packets_ignored += 1
            return
        if not self._latched:
            self._latched = True
            self._remote = source
            self._remote_rtcp = (source[0], source[1] + 1)
        self.packets_received += 1
        if packet.payload_type == self.offer.payload_type:
            self._hook.add(packet)
        elif packet.payload_type == self.offer.dtmf_payload_type:
            self._on_event_packet(packet)
        else:
            self.packets_ignored += 1  # comfort noise, or a codec we did not agree on

    def _allowed_sources(self) -> set[str]:
        """The SDP's address, the caller's signalling address (a NAT may have rewritten the
        SDP's), and wherever the caller's media already comes from."""
        allowed = {self.offer.address, self.signaling_ip}
        if self._remote is not None:
            allowed.add(self._remote[0])
        return allowed

    def _on_event_packet(self, packet: RtpPacket) -> None:
        try:
            digit = self._presses.packet(packet.timestamp, packet.payload)
        except DtmfError:
            self.packets_ignored += 1
            return
        if digit is not None:
            self._on_digit(digit, "rfc4733")

    def _on_rtcp(self, data: bytes, source: Address) -> None:
        pass  # receiver reports from the phone are not acted on

    # -- outbound -------------------------------------------------------------------------

    async def _send_loop(self) -> None:
        """One RTP packet per pacer frame; paused (the pacer's clock too) while on hold."""
        first = True
        while True:
            if not self._sending.is_set():
                await self._sending.wait()
                first = True
            frame = await self._pacer.recv()
            payload = bytes(frame)
            if self._remote is not None and self.offer is not None:
                packet = RtpPacket(self.offer.payload_type, self._seq, self._timestamp, self.ssrc, payload,
                                   marker=first)
                self._rtp.transport.sendto(packet.to_bytes(), self._remote)
                self.packets_sent += 1
                self.octets_sent += len(payload)
                first = False
            self._seq = (self._seq + 1) & 0xFFFF
            self._timestamp = (self._timestamp + WIRE_FRAME_SAMPLES) & 0xFFFFFFFF

    async def _report_loop(self) -> None:
        while True:
            await asyncio.sleep(RTCP_INTERVAL_S)
            if self._remote_rtcp is not None and self.packets_sent:
                report = sender_report(self.ssrc, self._timestamp, self.packets_sent, self.octets_sent,
                                       f"parley@{self.port}", time.time())
                self._rtcp.transport.sendto(report, self._remote_rtcp)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        self._rtp.transport.close()
        self._rtcp.transport.close()

"""RTP and RTCP packets for SIP media (RFC 3550): the fixed header, and sender reports.

Only what a G.711 phone call needs: version 2 packets with optional CSRCs and header
extension (skipped), padding removed; RTCP packets are recognised and compound SR/RR read
for nothing but their type (Parley sends sender reports; it does not steer by the peer's).
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass

RTP_VERSION = 2
RTP_HEADER = struct.Struct("!BBHII")
RTCP_SR = 200
RTCP_RR = 201
RTCP_SDES = 202
RTCP_BYE = 203
NTP_EPOCH_OFFSET = 2208988800  # seconds from 1900 (NTP) to 1970 (Unix)
CNAME_ITEM = 1


class RtpError(ValueError):
    """Not an RTP packet Parley can play."""


@dataclass(frozen=True)
class RtpPacket:
    payload_type: int
    sequence_number: int
    timestamp: int
    ssrc: int
    payload: bytes
    marker: bool = False

    def to_bytes(self) -> bytes:
        second = (0x80 if self.marker else 0) | self.payload_type
        return RTP_HEADER.pack(RTP_VERSION << 6, second, self.sequence_number & 0xFFFF,
                               self.timestamp & 0xFFFFFFFF, self.ssrc) + self.payload


def is_rtcp(data: bytes) -> bool:
    """RFC 5761 4: RTCP packet types 192-223 share the second byte's range with RTP's marker."""
    return len(data) >= 2 and 192 <= data[1] <= 223


def parse_rtp(data: bytes) -> RtpPacket:
    if len(data) < RTP_HEADER.size:
        raise RtpError("shorter than an RTP header")
    first, second, seq, timestamp, ssrc = RTP_HEADER.unpack_from(data)
    if first >> 6 != RTP_VERSION:
        raise RtpError("not RTP version 2")
    offset = RTP_HEADER.size + 4 * (first & 0x0F)
    if first & 0x10:  # header extension: skip it
        if len(data) < offset + 4:
            raise RtpError("truncated header extension")
        offset += 4 + 4 * struct.unpack_from("!H", data, offset + 2)[0]
    end = len(data)
    if first & 0x20:  # padding: the last byte says how much
        end -= data[-1]
    if offset > end:
        raise RtpError("truncated packet")
    return RtpPacket(second & 0x7F, seq, timestamp, ssrc, bytes(data[offset:end]), bool(second & 0x80))


def ntp_timestamp(unix_time: float) -> tuple[int, int]:
    """(seconds, fraction) of the NTP format for a Unix time."""
    seconds = int(unix_time) + NTP_EPOCH_OFFSET
    fraction = int((unix_time % 1.0) * (1 << 32)) & 0xFFFFFFFF
    return seconds & 0xFFFFFFFF, fraction


def sender_report(ssrc: int, rtp_timestamp: int, packets: int, octets: int, cname: str,
                  now: float | None = None) -> bytes:
    """A compound RTCP packet: SR without report blocks, then SDES with our CNAME (RFC 3550 6.1)."""
    seconds, fraction = ntp_timestamp(time.time() if now is None else now)
    sr = struct.pack("!BBHIIIIII", 0x80, RTCP_SR, 6, ssrc, seconds, fraction,
                     rtp_timestamp & 0xFFFFFFFF, packets & 0xFFFFFFFF, octets & 0xFFFFFFFF)
    name = cname.encode()[:255]
    chunk = struct.pack("!IBB", ssrc, CNAME_ITEM, len(name)) + name + b"\x00"
    chunk += b"\x00" * (-len(chunk) % 4)
    sdes = struct.pack("!BBH", 0x81, RTCP_SDES, len(chunk) // 4) + chunk
    return sr + sdes


def parse_sender_report(data: bytes) -> dict:
    """The sender-info fields of an SR (tests and diagnostics)."""
    if len(data) < 28 or data[1] != RTCP_SR:
        raise RtpError("not an RTCP sender report")
    ssrc, seconds, fraction, rtp_ts, packets, octets = struct.unpack_from("!IIIIII", data, 4)
    return {"ssrc": ssrc, "ntp": seconds + fraction / (1 << 32) - NTP_EPOCH_OFFSET, "rtp_timestamp": rtp_ts,
            "packets": packets, "octets": octets}

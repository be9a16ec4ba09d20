"""DTMF from a phone: RFC 4733 telephone-events in RTP, and SIP INFO as the fallback.

An RFC 4733 key press is a run of packets with one RTP timestamp (the press's start),
repeated while the key is held and three times more with the end bit; each press is
reported once, on its first packet, so the responder hears it without waiting for the
release. SIP INFO carries a press as `application/dtmf-relay` (`Signal=5`) or
`application/dtmf` (`5`).
"""

from __future__ import annotations

import struct
from collections import deque
from dataclasses import dataclass
from typing import Deque, Optional

EVENT_DIGITS = "0123456789*#ABCD"  # RFC 4733 event codes 0-15
EVENT_PAYLOAD = struct.Struct("!BBH")
RECENT_PRESSES = 16  # timestamps remembered to drop a press's repeats and end packets
INFO_TYPES = ("application/dtmf-relay", "application/dtmf")


class DtmfError(ValueError):
    """A telephone-event payload or INFO body Parley cannot read."""


@dataclass(frozen=True)
class TelephoneEvent:
    digit: str
    end: bool
    volume: int
    duration: int  # RTP timestamp units (8 kHz)


def parse_event(payload: bytes) -> Optional[TelephoneEvent]:
    """One RFC 4733 payload; None for events that are not keys (tones, flash)."""
    if len(payload) < EVENT_PAYLOAD.size:
        raise DtmfError("telephone-event payload shorter than 4 bytes")
    event, flags, duration = EVENT_PAYLOAD.unpack_from(payload)
    if event >= len(EVENT_DIGITS):
        return None
    return TelephoneEvent(EVENT_DIGITS[event], bool(flags & 0x80), flags & 0x3F, duration)


def event_payload(digit: str, end: bool, duration: int, volume: int = 10) -> bytes:
    """The payload for one packet of a key press (tests, and any future outbound DTMF)."""
    return EVENT_PAYLOAD.pack(EVENT_DIGITS.index(digit), (0x80 if end else 0) | volume, duration)


class PressDetector:
    """Turns a stream of telephone-event packets into one report per key press."""

    def __init__(self) -> None:
        self._seen: Deque[int] = deque(maxlen=RECENT_PRESSES)

    def packet(self, timestamp: int, payload: bytes) -> Optional[str]:
        """The digit pressed if this packet starts a new press, else None."""
        event = parse_event(payload)
        if event is None or timestamp in self._seen:
            return None
        self._seen.append(timestamp)
        return event.digit


def parse_info(content_type: str, body: bytes) -> str:
    """The digit of a SIP INFO DTMF body; DtmfError when there is none."""
    text = body.decode("utf-8", "replace")
    if content_type == "application/dtmf-relay":
        fields = {k.strip().lower(): v.strip() for k, _, v in
                  (line.partition("=") for line in text.splitlines()) if k.strip()}
        signal = fields.get("signal", "")
    elif content_type == "application/dtmf":
        signal = text.strip()
    else:
        raise DtmfError(f"INFO body type {content_type!r} is not DTMF")
    signal = {"10": "*", "11": "#"}.get(signal, signal).upper()  # some phones send event codes
    if len(signal) != 1 or signal not in EVENT_DIGITS:
        raise DtmfError(f"INFO carries no DTMF key (Signal={signal!r})")
    return signal

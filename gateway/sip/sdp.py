"""SDP offer/answer for SIP calls (RFC 3264, RFC 4566): G.711 and telephone-event only.

Parley answers the first audio stream of an offer with the first of PCMU or PCMA the offer
lists (the caller's preference), plus telephone-event/8000 when offered (RFC 4733 DTMF).
The direction attribute carries hold: a caller who offers `sendonly` or `inactive` (or the
old `c=0.0.0.0`) has put Parley on hold, and Parley stops sending until it is taken off.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

CLOCK_RATE = 8000  # G.711 and telephone-event
PTIME_MS = 20
STATIC_PAYLOAD_TYPES = {0: "PCMU", 8: "PCMA"}  # RFC 3551 static assignments
SUPPORTED = ("PCMU", "PCMA")
MAX_SDP_BYTES = 16 * 1024
DIRECTIONS = ("sendrecv", "sendonly", "recvonly", "inactive")
ANSWER_DIRECTION = {"sendrecv": "sendrecv", "sendonly": "recvonly", "recvonly": "sendonly", "inactive": "inactive"}


class SdpError(ValueError):
    """An offer Parley cannot answer (the text is safe for a 488's reason and the log)."""


@dataclass(frozen=True)
class AudioOffer:
    """What Parley needs from an offer: where to send, which codec, and the direction."""

    address: str
    port: int
    codec: str  # PCMU | PCMA
    payload_type: int
    dtmf_payload_type: Optional[int]
    direction: str  # the offerer's direction attribute
    rtcp_port: int

    @property
    def on_hold(self) -> bool:
        """The caller will not listen to Parley (sendonly, inactive or the 0.0.0.0 address)."""
        return self.direction in ("sendonly", "inactive") or self.address == "0.0.0.0"


def parse_offer(sdp: str, prefer: str = "") -> AudioOffer:
    """The offer's first audio stream; `prefer` picks that codec when offered (a re-INVITE keeps the call's)."""
    if len(sdp.encode("utf-8", "replace")) > MAX_SDP_BYTES:
        raise SdpError("SDP too large")
    session_address, media, direction = None, None, "sendrecv"
    rtpmaps: dict[int, str] = {}
    media_address, rtcp_port = None, None
    for raw in sdp.replace("\r\n", "\n").split("\n"):
        line = raw.strip()
        if len(line) < 2 or line[1] != "=":
            continue
        kind, value = line[0], line[2:]
        if kind == "m":
            if media is not None:
                break  # only the first media section is answered with audio
            media = value.split()
        elif kind == "c":
            parts = value.split()
            if len(parts) < 3 or parts[0] != "IN" or parts[1] not in ("IP4", "IP6"):
                raise SdpError(f"bad connection line c={value}")
            address = parts[2].split("/")[0]
            if media is None:
                session_address = address
            else:
                media_address = address
        elif kind == "a":
            name, _, rest = value.partition(":")
            if name in DIRECTIONS:
                direction = name
            elif name == "rtpmap" and media is not None:
                number, _, encoding = rest.partition(" ")
                if number.isdigit():
                    rtpmaps[int(number)] = encoding.strip()
            elif name == "rtcp" and rest.split()[:1] and rest.split()[0].isdigit():
                rtcp_port = int(rest.split()[0])
    return _choose(media, media_address or session_address, rtpmaps, direction, rtcp_port, prefer)


def _choose(media: Optional[list[str]], address: Optional[str], rtpmaps: dict[int, str], direction: str,
            rtcp_port: Optional[int], prefer: str) -> AudioOffer:
    if media is None or media[0] != "audio":
        raise SdpError("the offer has no audio stream (m=audio)")
    if len(media) < 4 or not media[1].split("/")[0].isdigit():
        raise SdpError("bad m=audio line")
    if media[2] != "RTP/AVP":
        raise SdpError(f"transport {media[2]} is not supported (plain RTP/AVP only)")
    if address is None:
        raise SdpError("no connection address (c=)")
    port = int(media[1].split("/")[0])
    if not 0 <= port <= 65535:
        raise SdpError("media port out of range")
    payload_types = [int(p) for p in media[3:] if p.isdigit() and int(p) < 128]
    names = {pt: (rtpmaps.get(pt) or STATIC_PAYLOAD_TYPES.get(pt, "")) for pt in payload_types}
    usable = [(pt, name.split("/")[0].upper()) for pt, name in names.items() if name.split("/")[0].upper() in SUPPORTED]
    codec = next((c for c in usable if c[1] == prefer), usable[0] if usable else None)
    if codec is None:
        raise SdpError("no codec in common: Parley speaks PCMU and PCMA")
    dtmf = next((pt for pt, name in names.items() if name.lower().startswith("telephone-event/8000")), None)
    return AudioOffer(address, port, codec[1], codec[0], dtmf, direction, rtcp_port or port + 1)


def build_answer(offer: AudioOffer, address: str, port: int, session_id: int, version: int) -> str:
    """Our answer: the chosen codec, telephone-event when offered, and the direction that
    mirrors the offer's (a caller's sendonly hold is answered recvonly)."""
    payload_types = [offer.payload_type] + ([offer.dtmf_payload_type] if offer.dtmf_payload_type is not None else [])
    lines = ["v=0", f"o=parley {session_id} {version} IN IP4 {address}", "s=Parley",
             f"c=IN IP4 {address}", "t=0 0",
             f"m=audio {port} RTP/AVP {' '.join(map(str, payload_types))}",
             f"a=rtpmap:{offer.payload_type} {offer.codec}/{CLOCK_RATE}"]
    if offer.dtmf_payload_type is not None:
        lines += [f"a=rtpmap:{offer.dtmf_payload_type} telephone-event/{CLOCK_RATE}",
                  f"a=fmtp:{offer.dtmf_payload_type} 0-16"]
    direction = "inactive" if offer.address == "0.0.0.0" else ANSWER_DIRECTION[offer.direction]
    lines += [f"a=ptime:{PTIME_MS}", f"a={direction}"]
    return "\r\n".join(lines) + "\r\n"


def new_session_id() -> int:
    return int(time.time() * 1000) & 0x7FFFFFFF

"""SDP checks and edits around aiortc's offer/answer handling."""

from __future__ import annotations

import re

MAX_SDP_BYTES = 64 * 1024
_LINE = re.compile(r"^[a-z]=[^\x00]*$")
_MEDIA_LINE = re.compile(r"^m=[a-z]+ \d{1,5}(/\d+)? [A-Za-z0-9/]+( \S+)+$")  # RFC 8866 section 5.14


class SdpError(ValueError):
    """The offer cannot be answered; the message says why, for the client."""


def check_offer(sdp: str) -> None:
    """Cheap structural checks before aiortc parses the offer (clearer errors, less work)."""
    if not sdp.strip():
        raise SdpError("SDP offer is empty")
    if not sdp.lstrip().startswith("v=0"):
        raise SdpError("SDP must start with 'v=0'")
    lines = [line for line in sdp.replace("\r\n", "\n").split("\n") if line]
    for number, line in enumerate(lines, 1):
        if not _LINE.match(line):
            raise SdpError(f"SDP line {number} is not '<letter>=<value>'")
        if line.startswith("m=") and not _MEDIA_LINE.match(line):
            raise SdpError(f"SDP line {number} is not a valid media line: {line[:60]!r}")
    if not any(line.startswith("m=audio ") for line in lines):
        raise SdpError("SDP offer has no audio media section (m=audio)")
    if "a=ice-ufrag:" not in sdp or "a=fingerprint:" not in sdp:
        raise SdpError("SDP offer lacks ICE credentials or a DTLS fingerprint (truncated?)")


def opus_payload_type(sdp: str) -> int | None:
    match = re.search(r"^a=rtpmap:(\d+) opus/48000", sdp, re.MULTILINE | re.IGNORECASE)
    return int(match.group(1)) if match else None


def enable_opus_fec(answer_sdp: str) -> str:
    """Ask the caller to send Opus in-band FEC (useinbandfec=1 on our receive side).

    aiortc's answer carries no Opus fmtp; browsers only add FEC when the receiver asks.
    """
    pt = opus_payload_type(answer_sdp)
    if pt is None:
        return answer_sdp
    lines = answer_sdp.split("\r\n")
    fmtp_prefix = f"a=fmtp:{pt} "
    for i, line in enumerate(lines):
        if line.startswith(fmtp_prefix):
            if "useinbandfec" not in line:
                lines[i] = line + ";useinbandfec=1"
            return "\r\n".join(lines)
    for i, line in enumerate(lines):
        if line.startswith(f"a=rtpmap:{pt} "):
            lines.insert(i + 1, f"{fmtp_prefix}minptime=10;useinbandfec=1")
            break
    return "\r\n".join(lines)

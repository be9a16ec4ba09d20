"""The gateway's input parsers as fuzz targets: one function per parser, bytes in.

A target returns normally when the parser accepted the input or refused it the documented
way (the error the gateway turns into a 400/401 or an `error` event); any other exception
is a bug. Shared by the property tests (tests/test_properties.py, a few hundred inputs each)
and bench/fuzz.py (100k+ inputs each, with hang and memory figures).

Each target runs the real gateway code on the path a hostile client reaches:

    sdp           POST /v1/calls offer: check_offer, the Opus check, aiortc's SDP parser
                  (Call.answer wraps its failures in SdpError), enable_opus_fec on the result
    json_body     POST /v1/calls body: parse_offer_json, resumed_session, last_seq_of
    data_channel  a data-channel message through EventChannel.receive to the conversation's
                  real handlers (ping, playout.started, playback.cut)
    resume_token  tokens.verify, and a genuine token with bytes spliced in
    rtp_payload   RTP payloads (any bytes, any seq/timestamp) into the jitter buffer with
                  the real libopus decoder, then pulled as 20 ms frames
"""

from __future__ import annotations

import json
import struct
from typing import Callable

from aiortc.sdp import SessionDescription

from gateway import tokens
from gateway.app import last_seq_of, parse_offer_json, resumed_session
from gateway.config import Config
from gateway.conversation import Conversation
from gateway.errors import ApiError
from gateway.events import EventChannel
from gateway.jitter import FRAME_MS, SAMPLE_RATE, JitterBuffer
from gateway.opus import OpusDecoder
from gateway.pacer import PacedAudioTrack
from gateway.responders.echo import EchoResponder
from gateway.sdp import SdpError, check_offer, enable_opus_fec, opus_payload_type
from tests.kit.peer import QUIET  # real Opus packets (100 ms of silence): the RTP seed

SECRET = "fuzz-secret"
FRAME_SAMPLES = SAMPLE_RATE * FRAME_MS // 1000

# A real aiortc offer (audio sendrecv + the events data channel), the seed the mutators start from.
OFFER = (
    "v=0\r\no=- 4005247262 4005247262 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\na=group:BUNDLE 0 1\r\n"
    "a=msid-semantic:WMS *\r\nm=audio 59475 UDP/TLS/RTP/SAVPF 96 9 0 8\r\nc=IN IP4 192.0.2.2\r\n"
    "a=sendrecv\r\na=extmap:1 urn:ietf:params:rtp-hdrext:sdes:mid\r\na=mid:0\r\na=rtcp:9 IN IP4 0.0.0.0\r\n"
    "a=rtcp-mux\r\na=ssrc:2504946569 cname:8aac672f\r\na=rtpmap:96 opus/48000/2\r\na=rtpmap:9 G722/8000\r\n"
    "a=rtpmap:0 PCMU/8000\r\na=rtpmap:8 PCMA/8000\r\n"
    "a=candidate:f957a2332b1715da 1 udp 2130706431 192.0.2.2 59475 typ host\r\na=end-of-candidates\r\n"
    "a=ice-ufrag:7KVW\r\na=ice-pwd:R73QTOPeBAajXCFbUQVM7v\r\n"
    "a=fingerprint:sha-256 3F:10:42:36:AB:8D:9F:27:C1:14:D4:B2:41:7F:EE:57:D4:F3:15:1E:F5:D6:A3:C8:BE:D2:54:"
    "A4:10:8D:82:16\r\na=setup:actpass\r\n"
    "m=application 32893 UDP/DTLS/SCTP webrtc-datachannel\r\nc=IN IP4 192.0.2.2\r\na=mid:1\r\n"
    "a=sctp-port:5000\r\na=max-message-size:262144\r\n"
    "a=candidate:f957a2332b1715da 1 udp 2130706431 192.0.2.2 32893 typ host\r\na=end-of-candidates\r\n"
    "a=ice-ufrag:7KVW\r\na=ice-pwd:R73QTOPeBAajXCFbUQVM7v\r\n"
    "a=fingerprint:sha-256 3F:10:42:36:AB:8D:9F:27:C1:14:D4:B2:41:7F:EE:57:D4:F3:15:1E:F5:D6:A3:C8:BE:D2:54:"
    "A4:10:8D:82:16\r\na=setup:actpass\r\n")

# The refusals each JSON-body step may give (status, code); anything else is a bug.
JSON_REFUSALS = {(400, "invalid_encoding"), (400, "invalid_json"), (400, "invalid_offer"),
                 (401, "invalid_resume_token"), (400, "invalid_last_seq")}
# The error events a client message may draw; the message itself must never raise.
MESSAGE_ERRORS = {"bad_message", "unknown_message"}


def sdp(data: bytes) -> None:
    text = data.decode("utf-8", "replace")
    try:
        check_offer(text)
    except SdpError:
        return
    if opus_payload_type(text) is None:
        return
    try:
        SessionDescription.parse(text)
    except Exception:  # noqa: BLE001 - Call.answer turns any aiortc parse failure into SdpError
        return
    answer = enable_opus_fec(text.replace("\n", "\r\n") if "\r\n" not in text else text)
    assert isinstance(answer, str) and opus_payload_type(answer) is not None


_CONFIG = Config(secret=SECRET)


def json_body(data: bytes) -> None:
    try:
        payload = parse_offer_json(data)
        assert payload["type"] == "offer" and isinstance(payload["sdp"], str)
        session_id = resumed_session(payload, _CONFIG)
        assert session_id is None or isinstance(session_id, str)
        assert last_seq_of(payload) >= 0
    except ApiError as exc:
        assert (exc.status, exc.code) in JSON_REFUSALS, (exc.status, exc.code)


class MessageTarget:
    """One conversation's event channel, fed message after message (its state carries over,
    as on a real call: a playout report can only be used once)."""

    def __init__(self) -> None:
        self.emitted: list[dict] = []
        self.events = EventChannel(on_emit=lambda event, text: self.emitted.append(event))
        # The conversation registers its real handlers on the channel; nothing here runs it
        # (no recognizer or voice is needed to answer client messages).
        self.conversation = Conversation(None, lambda: None, EchoResponder(), PacedAudioTrack(), self.events)

    def __call__(self, data: bytes) -> None:
        before = len(self.emitted)
        message: str | bytes = data
        try:
            message = data.decode("utf-8")
        except UnicodeDecodeError:
            pass  # a binary message: the channel must refuse it the same way
        self.events.receive(message)
        for event in self.emitted[before:]:
            assert event["type"] in ("pong", "metrics.turn", "error"), event
            if event["type"] == "error":
                assert event["code"] in MESSAGE_ERRORS, event
        if len(self.emitted) > 10_000:
            self.emitted.clear()  # the bench sends 100k messages; keep the record small


_GENUINE = tokens.issue("session-1", SECRET, 3600)


def resume_token(data: bytes) -> None:
    candidates: list[object] = [data.decode("utf-8", "replace"), data]
    cut = data[0] % (len(_GENUINE) + 1) if data else 0
    candidates.append(_GENUINE[:cut] + data.decode("latin-1") + _GENUINE[cut:])
    for token in candidates:
        try:
            session_id = tokens.verify(token, SECRET)
        except tokens.TokenError:
            continue
        # Only a genuine signature verifies, so whatever is accepted names the session we
        # issued (base64's ignored trailing bits may let a spelling variant through).
        assert session_id == "session-1", token


class RtpTarget:
    """One jitter buffer with a real Opus decoder; each input is a run of RTP packets
    (2-byte seq step, 4-byte timestamp step, 1-byte length, payload) pulled as frames."""

    def __init__(self) -> None:
        self.buffer = JitterBuffer(OpusDecoder(SAMPLE_RATE))
        self.seq, self.timestamp, self.now = 0, 0, 0.0

    def __call__(self, data: bytes) -> None:
        at = 0
        while at + 7 <= len(data):
            seq_step, ts_step, length = struct.unpack_from(">hiB", data, at)
            at += 7
            payload = data[at:at + length]
            at += length
            self.seq = (self.seq + seq_step) & 0xFFFF
            self.timestamp = (self.timestamp + ts_step) & 0xFFFFFFFF
            self.now += 0.02
            self.buffer.put(self.seq, self.timestamp, payload, self.now)
            frame = self.buffer.pull(self.now)
            assert frame.pcm.shape == (FRAME_SAMPLES,), frame.pcm.shape
            assert frame.kind in ("normal", "fec", "plc", "silence"), frame.kind


def targets() -> dict[str, Callable[[bytes], None]]:
    """A fresh instance of every target (the stateful ones keep their state across inputs)."""
    return {"sdp": sdp, "json_body": json_body, "data_channel": MessageTarget(),
            "resume_token": resume_token, "rtp_payload": RtpTarget()}


def seeds() -> dict[str, list[bytes]]:
    """Valid inputs per target, for the mutators to start from."""
    offer_body = ('{"type": "offer", "sdp": %s, "resume_token": "%s", "last_seq": 3}'
                  % (json.dumps(OFFER), _GENUINE)).encode()
    rtp = b"".join(struct.pack(">hiB", 1, 960, len(p)) + p for p in QUIET)
    return {"sdp": [OFFER.encode()], "json_body": [offer_body, b'{"type":"offer","sdp":"v=0"}'],
            "data_channel": [b'{"type":"ping","id":1}', b'{"type":"playout.started","turn":1}',
                             b'{"type":"playback.cut","turn":2}'],
            "resume_token": [_GENUINE.encode()], "rtp_payload": [rtp]}

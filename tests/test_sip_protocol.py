"""The SIP bridge's protocol pieces on their own: the message parser (with a fuzz property
test), G.711 against the standard library's reference codec, RTP/RTCP, RFC 4733 and INFO
DTMF, SDP offer/answer, digest authentication, and RFC 3261 transaction timers over real
UDP sockets on loopback."""

from __future__ import annotations

import asyncio
import hashlib
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.sip import g711
from gateway.sip.agent import salvage_request
from gateway.sip.dtmf import DtmfError, PressDetector, event_payload, parse_info
from gateway.sip.message import Request, Response, SipParseError, parse
from gateway.sip.registration import digest_authorization, parse_challenge
from gateway.sip.rtp import RtpPacket, parse_rtp, parse_sender_report, sender_report
from gateway.sip.sdp import SdpError, build_answer, parse_offer
from gateway.sip.transaction import Timers, TransactionLayer, TransactionTimeout, new_branch

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop  # the reference G.711 (stdlib up to 3.12)

INVITE = (b"INVITE sip:parley@127.0.0.1 SIP/2.0\r\n"
          b"Via: SIP/2.0/UDP 127.0.0.1:5070;branch=z9hG4bK1;rport\r\n"
          b"v: SIP/2.0/UDP 10.0.0.1:5060;branch=z9hG4bK0\r\n"
          b"f: <sip:caller@127.0.0.1>;tag=abc\r\n"
          b"To: <sip:parley@127.0.0.1>\r\n"
          b"i: call-1\r\n"
          b"CSeq: 1 INVITE\r\n"
          b"Subject: a folded\r\n  header\r\n"
          b"Content-Type: application/sdp\r\n"
          b"Content-Length: 4\r\n\r\nv=0\r\nEXTRA")
OFFER = ("v=0\r\no=x 1 1 IN IP4 10.1.2.3\r\ns=-\r\nc=IN IP4 10.1.2.3\r\nt=0 0\r\n"
         "m=audio 4000 RTP/AVP 8 0 101\r\na=rtpmap:101 telephone-event/8000\r\na=sendrecv\r\n")


def test_a_request_parses_with_compact_and_folded_headers_and_round_trips():
    message = parse(INVITE)
    assert isinstance(message, Request) and message.method == "INVITE"
    assert message.call_id == "call-1" and message.cseq == (1, "INVITE")
    assert message.branch == "z9hG4bK1" and len(message.headers.get_all("via")) == 2
    assert message.headers.get("subject") == "a folded header"
    assert message.body == b"v=0\r"  # Content-Length cuts the datagram's tail
    again = parse(message.to_bytes())
    assert again.headers.get("from") == message.headers.get("from") and again.body == message.body


@pytest.mark.parametrize("data, problem", [
    (b"INVITE sip:x SIP/2.0\r\nVia: a\r\n\r\n", "missing from"),
    (b"HELLO\r\n\r\n", "bad start line"),
    (INVITE.replace(b"CSeq: 1 INVITE", b"CSeq: x INVITE"), "bad CSeq"),
    (INVITE.replace(b"Content-Length: 4", b"Content-Length: 400"), "longer than the body"),
    (INVITE.replace(b"CSeq: 1 INVITE", b"CSeq: 1 BYE"), "does not match"),
    (b"SIP/2.0 200 OK\r\nVia: a\r\n", "no blank line"),
])
def test_malformed_messages_raise_a_readable_error(data, problem):
    with pytest.raises(SipParseError, match=problem):
        parse(data)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=600), st.integers(0, len(INVITE)), st.binary(max_size=40))
def test_the_parser_never_fails_in_another_way(noise, cut, splice):
    """Fuzz: random bytes, and an INVITE cut and spliced with random bytes, either parse or
    raise SipParseError; and whatever parses can be written out and parsed again."""
    for data in (noise, INVITE[:cut] + splice + INVITE[cut:]):
        try:
            message = parse(data)
        except SipParseError:
            salvage_request(data)  # the 400 path must not fail either
            continue
        assert isinstance(message, (Request, Response))
        parse(message.to_bytes())


def test_g711_matches_the_reference_codec():
    pcm = np.random.default_rng(0).integers(-32768, 32767, 8000).astype(np.int16)
    for codec, lin2x, x2lin in (("PCMU", audioop.lin2ulaw, audioop.ulaw2lin), ("PCMA", audioop.lin2alaw, audioop.alaw2lin)):
        assert g711.encode(pcm, codec) == lin2x(pcm.tobytes(), 2)
        codes = bytes(range(256))
        assert g711.decode(codes, codec).tobytes() == x2lin(codes, 2)


def test_rate_changes_keep_a_tone_and_give_whole_frames():
    """A 1 kHz tone through the pacer-side encoder and the jitter-side decoder: 160 bytes per
    48 kHz frame, 320 samples per packet, and the tone's level survives (no clicks at edges)."""
    t = np.arange(48000) / 48000
    tone = (8000 * np.sin(2 * np.pi * 1000 * t)).astype(np.int16)
    encoder, decoder = g711.G711Encoder("PCMU"), g711.G711Decoder("PCMU")
    out = []
    for start in range(0, len(tone), 960):
        payload = encoder.encode(tone[start:start + 960])
        assert len(payload) == 160
        frame = decoder.decode(payload)
        assert len(frame) == 320
        out.append(frame)
    steady = np.concatenate(out)[1600:].astype(np.float64)
    rms = np.sqrt(np.mean(steady ** 2))
    assert 8000 / np.sqrt(2) * 0.9 < rms < 8000 / np.sqrt(2) * 1.1
    assert np.abs(np.diff(steady)).max() < 3300  # the tone moves at most 8000*2*pi*1000/16000 = 3142 per sample


def test_rtp_and_sender_reports_round_trip():
    packet = RtpPacket(0, 65535, 2 ** 32 - 1, 1234, b"\xff" * 160, marker=True)
    assert parse_rtp(packet.to_bytes()) == packet
    report = parse_sender_report(sender_report(1234, 8000, 50, 8000, "parley@x", now=1000.5))
    assert report["packets"] == 50 and report["octets"] == 8000 and abs(report["ntp"] - 1000.5) < 1e-6


def test_a_key_press_is_reported_once_and_info_bodies_are_read():
    presses = PressDetector()
    reported = [presses.packet(800, event_payload("5", end=False, duration=d)) for d in (160, 320)]
    reported += [presses.packet(800, event_payload("5", end=True, duration=480)) for _ in range(3)]
    reported.append(presses.packet(2400, event_payload("#", end=False, duration=160)))
    assert [r for r in reported if r] == ["5", "#"]
    assert parse_info("application/dtmf-relay", b"Signal=7\r\nDuration=160\r\n") == "7"
    assert parse_info("application/dtmf", b"*") == "*"
    with pytest.raises(DtmfError):
        parse_info("application/dtmf-relay", b"Signal=X")


def test_sdp_offer_answer_chooses_the_callers_codec_and_mirrors_hold():
    offer = parse_offer(OFFER)
    assert (offer.codec, offer.payload_type, offer.dtmf_payload_type, offer.port) == ("PCMA", 8, 101, 4000)
    answer = build_answer(offer, "127.0.0.1", 30000, 1, 1)
    assert "m=audio 30000 RTP/AVP 8 101" in answer and "a=sendrecv" in answer
    held = parse_offer(OFFER.replace("a=sendrecv", "a=sendonly"), prefer="PCMA")
    assert held.on_hold and "a=recvonly" in build_answer(held, "127.0.0.1", 30000, 1, 2)
    assert parse_offer(OFFER, prefer="PCMU").codec == "PCMU"
    with pytest.raises(SdpError, match="no codec in common"):
        parse_offer(OFFER.replace("8 0 101", "9 101"))
    with pytest.raises(SdpError, match="RTP/SAVP"):
        parse_offer(OFFER.replace("RTP/AVP", "RTP/SAVP"))


def test_digest_answers_the_rfc_2617_example():
    challenge = parse_challenge('Digest realm="testrealm@host.com", qop="auth,auth-int", '
                                'nonce="dcd98b7102dd2f0e8b11d0f600bfb0c093", opaque="5ccc069c403ebaf9f0171e9517f40e41"')
    header = digest_authorization(challenge, "GET", "/dir/index.html", "Mufasa", "Circle Of Life",
                                  cnonce="0a4f113b", nc=1)
    assert 'response="6629fae49393a05397450978507c4ef1"' in header  # RFC 2617 section 3.5
    plain = digest_authorization({"realm": "r", "nonce": "n"}, "REGISTER", "sip:x", "u", "p")
    ha1, ha2 = hashlib.md5(b"u:r:p").hexdigest(), hashlib.md5(b"REGISTER:sip:x").hexdigest()
    assert hashlib.md5(f"{ha1}:n:{ha2}".encode()).hexdigest() in plain


class _Peer(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.received: asyncio.Queue[bytes] = asyncio.Queue()

    def datagram_received(self, data, addr) -> None:
        self.received.put_nowait(data)


async def test_client_transactions_retransmit_and_time_out_on_timers():
    """Timer E/F (non-INVITE) and A/B (INVITE) over a real socket whose peer never answers:
    the request is repeated with growing intervals, then the transaction times out."""
    loop = asyncio.get_running_loop()
    transport, peer = await loop.create_datagram_endpoint(_Peer, local_addr=("127.0.0.1", 0))
    sender, _ = await loop.create_datagram_endpoint(asyncio.DatagramProtocol, local_addr=("127.0.0.1", 0))
    layer = TransactionLayer(lambda data, addr: sender.sendto(data, addr), Timers(t1=0.01, t2=0.04))
    try:
        for method in ("BYE", "INVITE"):
            request = parse(INVITE.replace(b"INVITE", method.encode()).replace(b"z9hG4bK1", new_branch().encode()))
            with pytest.raises(TransactionTimeout):
                await layer.request(request, transport.get_extra_info("sockname"))
            copies = 0
            while not peer.received.empty():
                copies += parse(peer.received.get_nowait()).method == method
            # 64*T1 = 0.64 s: doubling from 10 ms gives 7 sends (INVITE); capped at 40 ms, ~18 (BYE)
            assert copies >= (5 if method == "INVITE" else 10)
        assert not layer.clients
    finally:
        transport.close()
        sender.close()

"""Property tests of every parser a hostile client reaches: the SDP offer, the JSON body of
POST /v1/calls, data-channel messages, resume tokens and RTP payloads. Each either accepts
its input or refuses it the documented way (a 400/401, an `error` event, a concealed frame),
never another exception. The targets live in tests/kit/fuzz_targets.py, where
bench/fuzz.py runs them on 100k+ inputs each; here a few hundred structured ones (the SIP
parser's fuzz is in tests/test_sip_protocol.py)."""

from __future__ import annotations

import json
import struct

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gateway import tokens
from tests.kit import fuzz_targets
from tests.kit.fuzz_targets import OFFER, SECRET, MessageTarget, RtpTarget

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
OFFER_LINES = OFFER.split("\r\n")
JSON_LEAVES = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=40)
JSON_VALUES = st.recursive(JSON_LEAVES, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)


@st.composite
def mutated_offers(draw) -> str:
    """The real offer with lines dropped, duplicated, replaced or cut: what a broken client,
    a truncating proxy or an attacker sends."""
    lines = list(OFFER_LINES)
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(lines) - 1))
        action = draw(st.sampled_from(["drop", "duplicate", "replace", "cut", "splice"]))
        if action == "drop":
            del lines[at]
        elif action == "duplicate":
            lines.insert(at, lines[at])
        elif action == "replace":
            lines[at] = draw(st.text(max_size=80))
        elif action == "cut":
            lines[at] = lines[at][:draw(st.integers(0, len(lines[at])))]
        else:
            lines[at] = lines[at] + draw(st.text(max_size=20))
        if not lines:
            break
    return draw(st.sampled_from(["\r\n", "\n"])).join(lines)


@SETTINGS
@given(mutated_offers() | st.text(max_size=400))
def test_an_offer_is_answered_or_refused_as_invalid_sdp(offer):
    fuzz_targets.sdp(offer.encode("utf-8", "surrogatepass"))


@SETTINGS
@given(st.fixed_dictionaries({}, optional={"type": st.just("offer") | JSON_VALUES, "sdp": st.just(OFFER) | JSON_VALUES,
                                           "resume_token": JSON_VALUES, "last_seq": JSON_VALUES})
       | JSON_VALUES, st.binary(max_size=8))
def test_a_call_body_is_accepted_or_a_400_or_401(body, tail):
    text = json.dumps(body).encode()
    fuzz_targets.json_body(text)
    fuzz_targets.json_body(text[:len(text) // 2] + tail)  # truncated, with junk


def is_playback_cut(message: bytes) -> bool:
    try:
        body = json.loads(message)
    except ValueError:
        return False
    return (isinstance(body, dict) and body.get("type") == "playback.cut" and type(body.get("turn")) is int
            and body["turn"] >= 1)


@SETTINGS
@given(st.lists(st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["ping", "playout.started", "playback.cut", "response.create"])},
                          optional={"turn": JSON_VALUES, "id": JSON_VALUES}).map(json.dumps),
    JSON_VALUES.map(json.dumps), st.text(max_size=60)), min_size=1, max_size=8).map(
        lambda messages: [m.encode("utf-8", "surrogatepass") for m in messages]))
@example([b'{"type": "playback.cut", "turn": 1}'])
def test_data_channel_messages_draw_events_never_exceptions(messages):
    target = MessageTarget()
    for message in messages:
        target(message)
    errors = [e for e in target.emitted if e["type"] == "error"]
    # one answer per message (a pong, a metric or an error), but for a well-formed playback.cut:
    # a notification, answered by nothing
    assert len(target.emitted) == len(messages) - sum(map(is_playback_cut, messages))
    assert all(e["code"] in fuzz_targets.MESSAGE_ERRORS for e in errors)


def test_an_oversized_or_binary_message_is_refused_the_same_way():
    target = MessageTarget()
    target(b"\xff\xfe" * 10)
    target(json.dumps({"type": "ping", "pad": "x" * 20_000}).encode())
    assert [e["code"] for e in target.emitted] == ["bad_message", "bad_message"]


@SETTINGS
@given(st.text(min_size=1, max_size=64), st.integers(1, 10**6))
def test_a_resume_token_verifies_only_for_its_own_session(session_id, ttl_s):
    token = tokens.issue(session_id, SECRET, ttl_s)
    assert tokens.verify(token, SECRET) == session_id
    for other in ("other-secret", SECRET + "x"):
        try:
            tokens.verify(token, other)
        except tokens.TokenError:
            continue
        raise AssertionError("a token verified under another secret")


@SETTINGS
@given(st.binary(max_size=200))
@example(b"\xe8")  # a non-ASCII signature once raised TypeError (a 500) in hmac.compare_digest
def test_a_forged_or_spliced_resume_token_is_refused(data):
    fuzz_targets.resume_token(data)


@SETTINGS
@given(st.lists(st.tuples(st.integers(-3, 300), st.integers(-2000, 50_000), st.binary(max_size=120)),
                min_size=1, max_size=30))
def test_any_rtp_payload_plays_out_as_a_20ms_frame(packets):
    """Payloads that are not Opus, empty, duplicated, reordered or far ahead: the buffer
    always hands the playout clock one 20 ms frame (decoded, concealed or silent)."""
    target = RtpTarget()
    target(b"".join(struct.pack(">hiB", seq, ts, len(payload)) + payload for seq, ts, payload in packets))
    stats = target.buffer.stats
    assert stats.frames_pulled == len(packets)

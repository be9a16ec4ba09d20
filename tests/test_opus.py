"""libopus through ctypes: round trip, in-band FEC beats plain concealment, errors are clean."""

import numpy as np
import pytest

from gateway import opus
from gateway.opus import OpusDecoder, OpusEncoder, OpusError
from tests.kit.signals import voiced_speech


def speechlike(frames: int, rate: int = 48000) -> list[np.ndarray]:
    signal = voiced_speech(frames / 50, rate) * 32767
    return np.split(signal.astype(np.int16), frames)


def error(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sqrt(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)))


def test_fec_recovers_a_lost_frame_better_than_plc():
    encoder = OpusEncoder(48000, bitrate=32000, expected_loss_pct=20)
    frames = speechlike(60)
    packets = [encoder.encode(f) for f in frames]
    lost = 40
    with_fec, with_plc = OpusDecoder(48000), OpusDecoder(48000)
    for k in range(lost):
        with_fec.decode(packets[k])
        with_plc.decode(packets[k])
    recovered = with_fec.decode_fec(packets[lost + 1])
    concealed = with_plc.conceal()
    reference = OpusDecoder(48000)
    for k in range(lost + 1):
        clean = reference.decode(packets[k])
    assert recovered.shape == concealed.shape == (960,)
    assert error(recovered, clean) < error(concealed, clean)


def test_decoder_rejects_garbage_with_an_error():
    decoder = OpusDecoder(16000)
    with pytest.raises(OpusError):
        decoder.decode(b"")
    rng = np.random.default_rng(0)
    failures = 0
    for _ in range(200):  # random bytes either decode to something or raise OpusError
        try:
            out = decoder.decode(rng.bytes(int(rng.integers(1, 300))))
            assert out.dtype == np.int16
        except OpusError:
            failures += 1
    assert failures > 0


def test_encoder_checks_frame_size():
    with pytest.raises(ValueError):
        OpusEncoder(48000).encode(np.zeros(100, dtype=np.int16))


def snr_db(decoded: np.ndarray, original: np.ndarray, delay: int) -> float:
    """How close the decoded audio is to what was encoded, past the codec's delay."""
    heard = decoded[delay:].astype(np.float64)
    sent = original[:len(heard)].astype(np.float64)
    return float(10 * np.log10(np.sum(sent ** 2) / np.sum((sent - heard) ** 2)))


def test_silence_is_not_encoded_again_and_the_speech_after_it_sounds_as_good(monkeypatch):
    speech = np.concatenate(speechlike(50))
    sent = np.concatenate([speech, np.zeros(48000, np.int16), speech])
    encoder, decoder = OpusEncoder(48000), OpusDecoder(48000)
    decoded = np.concatenate([decoder.decode(encoder.encode(frame)) for frame in np.split(sent, len(sent) // 960)])
    assert encoder.frames_spared >= 40  # the second of silence, after the first few frames

    # the same audio from an encoder that never settles: every frame goes through libopus
    monkeypatch.setattr(opus, "SETTLE_FRAMES", len(sent))
    reference, plain_decoder = OpusEncoder(48000), OpusDecoder(48000)
    plain = np.concatenate([plain_decoder.decode(reference.encode(frame)) for frame in np.split(sent, len(sent) // 960)])
    assert reference.frames_spared == 0

    delay = 312  # libopus' lookahead at 48 kHz (6.5 ms)
    after = slice(len(speech) + 48000, None)
    assert np.abs(decoded[len(speech) + 2000:len(speech) + 48000]).max() <= 4  # silence stayed silent
    assert snr_db(decoded[after], sent[after], delay) > snr_db(plain[after], sent[after], delay) - 1.0

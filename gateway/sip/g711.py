"""G.711 (PCMU and PCMA) at 8 kHz, and the rate changes between the phone and the engine.

Inbound, `G711Decoder` fits gateway/jitter.py's FrameDecoder: one RTP payload -> 16 kHz
PCM (what the recogniser listens at), with a fading repeat of the last frame as concealment
(G.711 has no FEC). Outbound, `G711Encoder` takes the pacer's 48 kHz frames and returns one
RTP payload, so the pacer (gateway/pacer.py) paces phone audio exactly as it paces Opus.

The companding follows the ITU-T G.711 reference (Sun's g711.c), computed once into
lookup tables: 65536 entries to encode, 256 to decode.
"""

from __future__ import annotations

import numpy as np

G711_RATE = 8000  # samples per second on the wire
ENGINE_RATE = 16000  # what the jitter buffer hands the recogniser
PACER_RATE = 48000  # what the pacer queues and hands the encoder
FRAME_MS = 20
WIRE_FRAME_SAMPLES = G711_RATE * FRAME_MS // 1000  # 160 bytes per packet
UP_FACTOR = ENGINE_RATE // G711_RATE  # 2
DOWN_FACTOR = PACER_RATE // G711_RATE  # 6
CUTOFF_HZ = 3600.0  # telephone band edge: below G.711's 4 kHz Nyquist with room for the filter skirt
UP_TAPS = 31  # interpolation filter length (at 16 kHz)
DOWN_TAPS = 121  # decimation filter length (at 48 kHz)
PLC_FADE = 0.5  # each concealed frame repeats the last at half the amplitude
MULAW_BIAS = 0x84
MULAW_CLIP = 8159  # in the 14-bit domain
ALAW_SEGMENT_ENDS = (0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF)
MULAW_SEGMENT_ENDS = (0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF)
CODECS = ("PCMU", "PCMA")


def _segment(value: int, ends: tuple[int, ...]) -> int:
    return next((i for i, end in enumerate(ends) if value <= end), len(ends))


def _linear_to_ulaw(sample: int) -> int:
    value = sample >> 2
    mask = 0xFF
    if value < 0:
        value, mask = -value, 0x7F
    value = min(value, MULAW_CLIP) + (MULAW_BIAS >> 2)
    segment = _segment(value, MULAW_SEGMENT_ENDS)
    if segment >= 8:
        return 0x7F ^ mask
    return ((segment << 4) | ((value >> (segment + 1)) & 0xF)) ^ mask


def _ulaw_to_linear(code: int) -> int:
    code = ~code & 0xFF
    t = (((code & 0x0F) << 3) + MULAW_BIAS) << ((code & 0x70) >> 4)
    return MULAW_BIAS - t if code & 0x80 else t - MULAW_BIAS


def _linear_to_alaw(sample: int) -> int:
    value = sample >> 3
    mask = 0xD5
    if value < 0:
        value, mask = -value - 1, 0x55
    segment = _segment(value, ALAW_SEGMENT_ENDS)
    if segment >= 8:
        return 0x7F ^ mask
    code = segment << 4
    code |= (value >> 1) & 0xF if segment < 2 else (value >> segment) & 0xF
    return code ^ mask


def _alaw_to_linear(code: int) -> int:
    code ^= 0x55
    t = (code & 0x0F) << 4
    segment = (code & 0x70) >> 4
    t = t + 8 if segment == 0 else (t + 0x108) << max(segment - 1, 0)
    return t if code & 0x80 else -t


_ALL_SAMPLES = range(-32768, 32768)
_ENCODE = {"PCMU": np.array([_linear_to_ulaw(s) for s in _ALL_SAMPLES], dtype=np.uint8),
           "PCMA": np.array([_linear_to_alaw(s) for s in _ALL_SAMPLES], dtype=np.uint8)}
_DECODE = {"PCMU": np.array([_ulaw_to_linear(c) for c in range(256)], dtype=np.int16),
           "PCMA": np.array([_alaw_to_linear(c) for c in range(256)], dtype=np.int16)}


def encode(pcm: np.ndarray, codec: str) -> bytes:
    """int16 PCM at 8 kHz -> G.711 bytes (one byte per sample)."""
    return _ENCODE[codec][pcm.astype(np.int32) + 32768].tobytes()


def decode(payload: bytes, codec: str) -> np.ndarray:
    """G.711 bytes -> int16 PCM at 8 kHz."""
    return _DECODE[codec][np.frombuffer(payload, dtype=np.uint8)]


def _lowpass(taps: int, cutoff_hz: float, rate: float, gain: float) -> np.ndarray:
    """A Hann-windowed sinc low-pass filter with the given DC gain."""
    n = np.arange(taps) - (taps - 1) / 2
    kernel = np.sinc(2 * cutoff_hz / rate * n) * np.hanning(taps)
    return (kernel * gain / kernel.sum()).astype(np.float64)


class StreamingFir:
    """Change the rate of a continuous stream by up/down (one of them 1), keeping the
    filter's history between frames so frame edges do not click."""

    def __init__(self, up: int, down: int, taps: int, rate_after_up: float) -> None:
        self.up, self.down = up, down
        self._kernel = _lowpass(taps, CUTOFF_HZ, rate_after_up, gain=up)
        self._history = np.zeros(taps - 1)
        self._phase = 0  # where the next kept output falls, across frames

    def __call__(self, pcm: np.ndarray) -> np.ndarray:
        x = pcm.astype(np.float64)
        if self.up > 1:
            stuffed = np.zeros(len(x) * self.up)
            stuffed[::self.up] = x
            x = stuffed
        extended = np.concatenate([self._history, x])
        self._history = extended[len(extended) - len(self._history):]
        filtered = np.convolve(extended, self._kernel, mode="valid")
        kept = filtered[self._phase::self.down]
        self._phase = (self._phase - len(filtered)) % self.down
        return np.clip(np.round(kept), -32768, 32767).astype(np.int16)


class G711Decoder:
    """RTP payload -> 16 kHz PCM for the jitter buffer (gateway.jitter.FrameDecoder)."""

    def __init__(self, codec: str) -> None:
        if codec not in CODECS:
            raise ValueError(f"unknown G.711 codec {codec!r}")
        self.codec = codec
        self._upsample = StreamingFir(UP_FACTOR, 1, UP_TAPS, ENGINE_RATE)
        self._last = np.zeros(WIRE_FRAME_SAMPLES * UP_FACTOR, dtype=np.int16)

    def decode(self, packet: bytes) -> np.ndarray:
        if not packet:
            raise ValueError("empty G.711 payload")
        self._last = self._upsample(decode(packet, self.codec))
        return self._last

    def decode_fec(self, next_packet: bytes) -> np.ndarray:
        return self.conceal()  # G.711 carries no redundancy

    def conceal(self) -> np.ndarray:
        """Repeat the last frame, fading: short gaps stay smooth, long ones fall silent."""
        self._last = (self._last * PLC_FADE).astype(np.int16)
        return self._last


class G711Encoder:
    """The pacer's 48 kHz 20 ms frames -> one G.711 RTP payload (fits PacedAudioTrack)."""

    def __init__(self, codec: str) -> None:
        if codec not in CODECS:
            raise ValueError(f"unknown G.711 codec {codec!r}")
        self.codec = codec
        self._downsample = StreamingFir(1, DOWN_FACTOR, DOWN_TAPS, PACER_RATE)

    def encode(self, pcm48k: np.ndarray) -> bytes:
        return encode(self._downsample(pcm48k), self.codec)

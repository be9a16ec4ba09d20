"""Opus codec through libopus (ctypes).

aiortc's own Opus encoder is fixed at 96 kbit/s stereo without FEC, and PyAV's decoder
cannot decode in-band FEC or run packet-loss concealment. Calling libopus directly gives
both ends what a voice gateway needs: a mono ~32 kbit/s encoder with in-band FEC, and a
decoder that recovers a lost frame from the next packet's FEC data or conceals it (PLC).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
from typing import Optional

import numpy as np

RTP_CLOCK_RATE = 48000  # Opus RTP timestamps always tick at 48 kHz (RFC 7587)
FRAME_MS = 20  # one Opus packet carries 20 ms of audio on both directions

OPUS_OK = 0
OPUS_APPLICATION_VOIP = 2048
OPUS_SET_BITRATE_REQUEST = 4002
OPUS_SET_INBAND_FEC_REQUEST = 4012
OPUS_SET_PACKET_LOSS_PERC_REQUEST = 4014
OPUS_SET_SIGNAL_REQUEST = 4024
OPUS_SIGNAL_VOICE = 3001
MAX_PACKET_BYTES = 1500
SETTLE_FRAMES = 5  # all-zero frames encoded for real after sound, before the encoder is spared


class OpusError(Exception):
    """libopus reported an error (bad packet, bad parameters)."""


def _load_libopus() -> ctypes.CDLL:
    """The system libopus, else the copy bundled inside PyAV's wheel."""
    candidates = []
    found = ctypes.util.find_library("opus")
    if found:
        candidates.append(found)
    try:
        import av

        libs = os.path.join(os.path.dirname(os.path.dirname(av.__file__)), "av.libs")
        candidates += sorted(glob.glob(os.path.join(libs, "libopus*.so*")))
    except ImportError:  # pragma: no cover - av is a hard dependency
        pass
    for path in candidates:
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    raise OSError("libopus not found: install Debian's libopus0 or the 'av' wheel")


_lib = _load_libopus()
_lib.opus_encoder_create.restype = ctypes.c_void_p
_lib.opus_encoder_create.argtypes = [ctypes.c_int32, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
_lib.opus_encoder_destroy.argtypes = [ctypes.c_void_p]
_lib.opus_encode.restype = ctypes.c_int32
_lib.opus_encode.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int32]
_lib.opus_encoder_ctl.restype = ctypes.c_int
_lib.opus_decoder_create.restype = ctypes.c_void_p
_lib.opus_decoder_create.argtypes = [ctypes.c_int32, ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
_lib.opus_decoder_destroy.argtypes = [ctypes.c_void_p]
_lib.opus_decode.restype = ctypes.c_int
_lib.opus_decode.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int32, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
_lib.opus_packet_get_nb_samples.restype = ctypes.c_int
_lib.opus_packet_get_nb_samples.argtypes = [ctypes.c_char_p, ctypes.c_int32, ctypes.c_int32]
_lib.opus_strerror.restype = ctypes.c_char_p
_lib.opus_strerror.argtypes = [ctypes.c_int]


def _check(code: int) -> int:
    if code < 0:
        raise OpusError(_lib.opus_strerror(code).decode())
    return code


class OpusEncoder:
    """Mono Opus encoder for speech: VOIP mode, in-band FEC, fixed 20 ms frames.

    Digital silence costs nothing: a gateway sends it most of a call (every frame in which
    Parley is not speaking), and libopus analyses a zero frame as dearly as speech (~0.4 ms
    at complexity 9; with 8 calls a sixth of the event loop's core). After SETTLE_FRAMES
    zero frames have been encoded for real, so the encoder's state (and the far decoder's)
    has decayed to silence, each further zero frame is sent as the last of those packets
    again and the encoder is not run. The next sound is encoded from that settled state:
    the far decoder, having decoded the same silence, stays in step with it."""

    def __init__(self, sample_rate: int = 48000, bitrate: int = 32000, expected_loss_pct: int = 10) -> None:
        error = ctypes.c_int()
        self.sample_rate = sample_rate
        self.frame_samples = sample_rate * FRAME_MS // 1000
        self._state = _lib.opus_encoder_create(sample_rate, 1, OPUS_APPLICATION_VOIP, ctypes.byref(error))
        _check(error.value)
        # Variadic ctl calls: integer arguments are passed as C ints.
        _check(_lib.opus_encoder_ctl(ctypes.c_void_p(self._state), OPUS_SET_BITRATE_REQUEST, ctypes.c_int32(bitrate)))
        _check(_lib.opus_encoder_ctl(ctypes.c_void_p(self._state), OPUS_SET_INBAND_FEC_REQUEST, ctypes.c_int32(1)))
        _check(_lib.opus_encoder_ctl(ctypes.c_void_p(self._state), OPUS_SET_PACKET_LOSS_PERC_REQUEST, ctypes.c_int32(expected_loss_pct)))
        _check(_lib.opus_encoder_ctl(ctypes.c_void_p(self._state), OPUS_SET_SIGNAL_REQUEST, ctypes.c_int32(OPUS_SIGNAL_VOICE)))
        self._out = ctypes.create_string_buffer(MAX_PACKET_BYTES)
        self._zero_frames = 0  # consecutive all-zero frames so far
        self._silence_packet = b""
        self.frames_spared = 0

    def encode(self, pcm: np.ndarray) -> bytes:
        """One 20 ms frame of int16 mono PCM in, one Opus packet out."""
        pcm = np.ascontiguousarray(pcm, dtype=np.int16)
        if pcm.shape != (self.frame_samples,):
            raise ValueError(f"expected {self.frame_samples} samples, got {pcm.shape}")
        if pcm.any():
            self._zero_frames = 0
        else:
            self._zero_frames += 1
            if self._zero_frames > SETTLE_FRAMES:
                self.frames_spared += 1
                return self._silence_packet
        size = _check(_lib.opus_encode(self._state, pcm.ctypes.data, self.frame_samples, self._out, MAX_PACKET_BYTES))
        packet = self._out.raw[:size]
        if self._zero_frames == SETTLE_FRAMES:
            self._silence_packet = packet
        return packet

    def __del__(self) -> None:
        if getattr(self, "_state", None):
            _lib.opus_encoder_destroy(self._state)
            self._state = None


class OpusDecoder:
    """Mono Opus decoder at any Opus rate (8/12/16/24/48 kHz) with FEC and PLC."""

    def __init__(self, sample_rate: int = 16000) -> None:
        error = ctypes.c_int()
        self.sample_rate = sample_rate
        self.frame_samples = sample_rate * FRAME_MS // 1000
        self._state = _lib.opus_decoder_create(sample_rate, 1, ctypes.byref(error))
        _check(error.value)
        # Room for the longest Opus packet (120 ms).
        self._pcm = np.zeros(sample_rate * 120 // 1000, dtype=np.int16)

    def _decode(self, data: Optional[bytes], samples: int, fec: bool) -> np.ndarray:
        length = len(data) if data else 0
        n = _check(_lib.opus_decode(self._state, data, length, self._pcm.ctypes.data, samples, int(fec)))
        return self._pcm[:n].copy()

    def decode(self, packet: bytes) -> np.ndarray:
        """Decode one packet (any duration) to int16 mono."""
        if not packet:
            raise OpusError("empty packet")
        return self._decode(packet, len(self._pcm), fec=False)

    def decode_fec(self, next_packet: bytes) -> np.ndarray:
        """Recover the frame lost before next_packet from its in-band FEC (LBRR) data.

        Without FEC data libopus falls back to concealment, so this never fails on loss.
        """
        return self._decode(next_packet, self.frame_samples, fec=True)

    def conceal(self) -> np.ndarray:
        """Packet-loss concealment for one 20 ms frame."""
        return self._decode(None, self.frame_samples, fec=False)

    def __del__(self) -> None:
        if getattr(self, "_state", None):
            _lib.opus_decoder_destroy(self._state)
            self._state = None


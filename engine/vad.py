"""Silero VAD v6 as a streaming speech detector: P(speech) per 32 ms window, state per stream.

Parley's SSM learned when speech starts from synthetic voices; on a few real voices it never
hears a start (2 of the 34 real-dev clips), and Whisper can only read a turn that started.
Silero VAD was trained on real speech in many languages: the turn reader (engine/whisper_stream.py)
starts a turn on whichever hears the caller first. It ships inside the faster-whisper wheel
(`faster_whisper/assets/silero_vad_v6.onnx`, MIT), pinned by pyproject.toml and by sha256 here;
~0.1 ms of one core per window.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .whisper import ChecksumMismatch, _import, sha256

SAMPLE_RATE = 16000
WINDOW = 512  # samples per decision (32 ms): the v6 model's fixed input
CONTEXT = 64  # samples of the previous window the model sees before each one
STATE_SHAPE = (1, 1, 128)  # its LSTM's h and c
SPEECH_ON, SPEECH_OFF = 0.5, 0.35  # P(speech) that starts a sound, and below which it has stopped
MODEL_SHA256 = "4cbf549b8326f60f80f2536d9eefeb450a9abe83365a098031c89719f1be17d2"  # faster-whisper 1.2.1's


def model_path() -> Path:
    package = _import("faster_whisper", "faster-whisper==1.2.1")
    return Path(package.__file__).parent / "assets" / "silero_vad_v6.onnx"


class SileroVad:
    """The ONNX session, shared by all streams (onnxruntime sessions are thread-safe)."""

    def __init__(self, check: bool = True) -> None:
        onnxruntime = _import("onnxruntime", "onnxruntime")
        path = model_path()
        if check and sha256(path) != MODEL_SHA256:
            raise ChecksumMismatch(f"{path}: not the Silero VAD v6 that faster-whisper 1.2.1 ships")
        options = onnxruntime.SessionOptions()
        options.inter_op_num_threads = options.intra_op_num_threads = 1
        options.log_severity_level = 4
        self.session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"],
                                                    sess_options=options)

    def stream(self) -> "VadStream":
        return VadStream(self)


class VadStream:
    """One stream's detector: push(audio) -> P(speech) of each window completed by it."""

    def __init__(self, vad: SileroVad) -> None:
        self.session = vad.session
        self.h = np.zeros(STATE_SHAPE, np.float32)
        self.c = np.zeros(STATE_SHAPE, np.float32)
        self.context = np.zeros(CONTEXT, np.float32)
        self.pending = np.zeros(0, np.float32)
        self.windows = 0  # windows decided so far: window k covers samples [k*WINDOW, (k+1)*WINDOW)

    def push(self, audio: np.ndarray) -> list[float]:
        self.pending = np.concatenate([self.pending, np.asarray(audio, np.float32)])
        out = []
        while len(self.pending) >= WINDOW:
            window, self.pending = self.pending[:WINDOW], self.pending[WINDOW:]
            x = np.concatenate([self.context, window])[None]
            p, self.h, self.c = self.session.run(None, {"input": x, "h": self.h, "c": self.c})
            self.context = window[-CONTEXT:]
            self.windows += 1
            out.append(float(np.asarray(p).reshape(-1)[0]))
        return out


def speech_breaks(audio: np.ndarray, vad: SileroVad, min_break_s: float) -> list[tuple[int, int]]:
    """[start, end) samples of the quiet stretches of at least `min_break_s` inside the speech
    of `audio` (speech starts and stops at SPEECH_ON / SPEECH_OFF, as the turn reader hears it)."""
    out, speaking, heard, quiet_from = [], False, False, 0
    for k, p in enumerate(vad.stream().push(audio)):
        if not speaking and p >= SPEECH_ON:
            if heard and (k - quiet_from) * WINDOW >= min_break_s * SAMPLE_RATE:
                out.append((quiet_from * WINDOW, k * WINDOW))
            speaking = heard = True
        elif speaking and p < SPEECH_OFF:
            speaking, quiet_from = False, k
    return out

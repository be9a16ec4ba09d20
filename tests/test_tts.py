"""Streaming TTS (engine/tts.py, engine/piper.py): the contracts, with a small random encoder
in front of Piper's real flow and decoder; the seams and the voice with the shipped weights."""

import numpy as np
import pytest
import torch

from engine import malloc, piper
from engine.interface import Audio, WordMark
from engine.text import normalize_text, phonemize, spoken_words
from engine.tts import (CHUNK_FRAMES, CONTEXT_FRAMES, FIRST_ENCODE_IDS, HOP, PRIOR_CHANNELS, SAMPLE_RATE,
                        SHIPPED_WEIGHTS, Synthesizer, TtsConfig, TtsModel, load_model, synthesize_offline,
                        synthesize_whole, to_int16)
from tests.kit.memory import rss_mib

TEXT = "Sure, your order 4512 ships on Monday. The total is $12.50, anything else?"
SEAM_LIMIT = 0.1  # chunked audio may differ from whole-utterance audio by this share of its RMS


@pytest.fixture(scope="module")
def model() -> TtsModel:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    return TtsModel(TtsConfig(width=32, encoder_depth=2, lookahead=4)).eval()


def run(model: TtsModel, pieces: list[str]) -> tuple[list[np.ndarray], list[WordMark]]:
    synth = Synthesizer(model)
    audio, marks = [], []
    for piece in pieces:
        synth.push_text(piece)
        for event in synth.events():
            (audio.append(event.pcm) if isinstance(event, Audio) else marks.append(event))
    synth.end()
    for event in synth.events():
        (audio.append(event.pcm) if isinstance(event, Audio) else marks.append(event))
    return audio, marks


def joined(chunks: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(chunks) if chunks else np.zeros(0, np.int16)


def relative_rms(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(np.sqrt(np.mean((a - b) ** 2)) / max(np.sqrt(np.mean(b ** 2)), 1e-9))


def seam_errors(chunks: list[np.ndarray], whole: np.ndarray, span: int = HOP) -> list[float]:
    """At each join of two chunks: the error against whole-utterance audio within `span`
    samples either side, relative to the whole utterance's RMS (a click would stand out)."""
    joins = np.cumsum([len(c) for c in chunks])[:-1]
    stream = joined(chunks)
    level = max(np.sqrt(np.mean(whole.astype(np.float64) ** 2)), 1e-9)
    return [float(np.sqrt(np.mean((stream[j - span:j + span].astype(np.float64) - whole[j - span:j + span]) ** 2)) / level)
            for j in joins]


def test_streaming_matches_offline_but_for_seams(model):
    offline, offline_marks = synthesize_offline(model, TEXT)
    chunks, marks = run(model, list(TEXT))
    streamed = joined(chunks)
    assert len(offline) > 0 and len(streamed) == len(offline)
    assert relative_rms(streamed, offline) < SEAM_LIMIT
    assert marks == offline_marks


def test_chunk_seams_match_whole_utterance_decoding(model):
    chunks, _ = run(model, [w + " " for w in TEXT.split(" ")])
    whole = to_int16(synthesize_whole(model, phonemize(normalize_text(TEXT))[0].ids))
    assert len(joined(chunks)) == len(whole) and len(chunks) >= 4
    assert max(seam_errors(chunks, whole)) < SEAM_LIMIT
    assert relative_rms(joined(chunks), whole) < SEAM_LIMIT


def test_word_marks_are_monotonic_and_cover_every_word(model):
    chunks, marks = run(model, [w + " " for w in TEXT.split(" ")])
    audio = joined(chunks)
    words = spoken_words(normalize_text(TEXT))
    assert [m.word for m in marks] == words
    offsets = [m.sample_offset for m in marks]
    assert offsets == sorted(offsets) and 0 <= offsets[0] and offsets[-1] < len(audio)


def test_cancel_stops_within_one_chunk(model):
    synth = Synthesizer(model)
    synth.push_text(TEXT * 3)
    synth.end()
    first = synth.pull()
    assert any(isinstance(e, Audio) for e in first)
    synth.cancel()
    assert synth.pull() == [] and synth.done
    synth.push_text("more text after cancel")  # ignored, no error
    assert list(synth.events()) == []
    assert all(len(e.pcm) <= CHUNK_FRAMES * HOP for e in first if isinstance(e, Audio))  # one chunk at most


def test_conv2d_renderer_matches_the_voice_as_cut():
    """The flow and decoder run as 2-D convolutions (piper._as_conv2d, for onnxruntime's faster
    kernels) give the graph's own audio within float rounding, for a chunk and a whole window."""
    prior = np.random.default_rng(0).normal(0, 0.6, (2, PRIOR_CHANNELS, 72)).astype(np.float32)
    plain, conv2d = piper.FrameRenderer(conv2d=False), piper.frame_renderer()
    for offset, frames in ((24, 24), (0, None)):
        expected, got = plain(prior, offset, frames), conv2d(prior, offset, frames)
        assert got.shape == expected.shape == (2, (frames or 72) * HOP)
        assert relative_rms(got, expected) < 1e-4


def test_the_renderer_hands_back_a_large_batchs_memory():
    """A busy minute renders every stream's chunk in one batch; the memory that took goes back
    once it is done. onnxruntime's own arena kept the largest batch ever rendered (+148 MB
    after 8 chunks of CHUNK_FRAMES), so an engine's RSS grew with its busiest moment."""
    libc = malloc._glibc()
    if libc is None:
        pytest.skip("not glibc: no malloc_trim to hand free pages back with")
    renderer = piper.FrameRenderer()  # its own sessions: the shared one may have rendered big batches
    window = CHUNK_FRAMES + 2 * CONTEXT_FRAMES
    prior = np.random.default_rng(0).normal(0, 0.6, (8, PRIOR_CHANNELS, window)).astype(np.float32)
    renderer(prior[:1], CONTEXT_FRAMES, CHUNK_FRAMES)
    libc.malloc_trim(0)
    before = rss_mib()
    renderer(prior, CONTEXT_FRAMES, CHUNK_FRAMES)
    libc.malloc_trim(0)
    assert rss_mib() - before < 100


def test_conv2d_rewrite_refuses_graphs_it_does_not_know():
    import onnx
    from onnx import helper

    graph = helper.make_graph([helper.make_node("Transpose", ["x"], ["y"], perm=[0, 2, 1])], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)])
    with pytest.raises(ValueError, match="Transpose"):
        piper._as_conv2d(helper.make_model(graph))


@pytest.mark.parametrize("hostile", ["", "   ", "😀" * 100, "<speak>x</speak>", "\x00\x1b", "你好", "9" * 200,
                                     "...!!!", "word " * 300])
def test_hostile_text_never_crashes(model, hostile):
    chunks, marks = run(model, [hostile])
    audio = joined(chunks)
    assert audio.dtype == np.int16
    assert len(marks) == len(spoken_words(normalize_text(hostile))) or len(hostile) > 1000


def state_bytes(synth: Synthesizer) -> int:
    tensors = [t for s in synth.encoder_state for t in (s.conv, s.h)] + [synth.history]
    return sum(t.numel() * t.element_size() for t in tensors)


def test_per_stream_state_is_bounded():
    synth = Synthesizer(TtsModel(TtsConfig()))  # the shipped size
    before = state_bytes(synth)
    synth.push_text("A sentence to move the state along. ")
    synth.end()
    list(synth.events())
    assert state_bytes(synth) == before <= 2 * 1024 * 1024
    assert synth.schedule.frames.shape[1] <= CONTEXT_FRAMES  # rendered frames are let go


shipped = pytest.mark.skipif(not SHIPPED_WEIGHTS.exists(), reason="no engine/weights/tts.safetensors")


@shipped
def test_shipped_voice_speaks_with_clean_seams():
    model = load_model()
    audio, marks = synthesize_offline(model, "Thank you for calling.")
    assert len(audio) > 0.3 * SAMPLE_RATE and len(marks) == 4
    assert np.abs(audio).max() > 1000
    chunks, _ = run(model, [w + " " for w in TEXT.split(" ")])
    whole = to_int16(synthesize_whole(model, phonemize(normalize_text(TEXT))[0].ids))
    assert max(seam_errors(chunks, whole)) < SEAM_LIMIT


@shipped
def test_the_first_chunk_waits_only_for_the_ids_it_needs():
    """Time to first audio: a whole reply pushed at once is encoded a piece at a time, the
    first piece only FIRST_ENCODE_IDS long; the audio is the same as encoding it whole."""
    model = load_model()
    synth = Synthesizer(model)
    synth.push_text(TEXT)
    synth.end()
    queued = len(synth.schedule.unencoded)
    first = synth.pull()
    assert any(isinstance(event, Audio) for event in first)
    assert len(synth.schedule.unencoded) == queued - FIRST_ENCODE_IDS  # the rest waits for the next chunk
    audio = [first[-1].pcm] + [event.pcm for event in synth.events() if isinstance(event, Audio)]
    assert synth.done and not synth.schedule.unencoded
    whole = to_int16(synthesize_whole(model, phonemize(normalize_text(TEXT))[0].ids))
    assert max(seam_errors(audio, whole)) < SEAM_LIMIT

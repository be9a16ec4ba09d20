"""Streaming TTS (engine/tts.py, engine/vocoder.py) with a small random model: the contracts,
not the voice. The shipped-weights test skips when engine/weights/tts.safetensors is absent."""


import numpy as np
import pytest
import torch

from engine import vocoder
from engine.interface import Audio, WordMark
from engine.text import normalize_text, phonemize, spoken_words
from engine.tts import (CHUNK_FRAMES, HOP, SHIPPED_WEIGHTS, Synthesizer, TtsConfig, TtsModel, load_model,
                        synthesize_offline, synthesize_parallel)

TEXT = "Sure, your order 4512 ships on Monday. The total is $12.50, anything else?"


@pytest.fixture(scope="module")
def model() -> TtsModel:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    return TtsModel(TtsConfig(width=32, encoder_depth=2, decoder_depth=2, lookahead=4)).eval()


def run(model: TtsModel, pieces: list[str]) -> tuple[np.ndarray, list[WordMark]]:
    synth = Synthesizer(model)
    audio, marks = [], []
    for piece in pieces:
        synth.push_text(piece)
        for event in synth.events():
            (audio.append(event.pcm) if isinstance(event, Audio) else marks.append(event))
    synth.end()
    for event in synth.events():
        (audio.append(event.pcm) if isinstance(event, Audio) else marks.append(event))
    return (np.concatenate(audio) if audio else np.zeros(0, np.int16)), marks


def test_streaming_equals_offline(model):
    offline, offline_marks = synthesize_offline(model, TEXT)
    streamed, marks = run(model, list(TEXT))
    assert len(offline) > 0 and len(streamed) == len(offline)
    assert np.abs(streamed.astype(np.int32) - offline).max() <= 2  # int16 LSBs of float rounding
    assert marks == offline_marks


def test_stream_matches_parallel_forward(model):
    offline, _ = synthesize_offline(model, TEXT)
    parallel = synthesize_parallel(model, phonemize(normalize_text(TEXT))[0].ids)
    assert len(parallel) == len(offline)
    assert np.abs(np.clip(parallel, -1, 1) * 32767 - offline).max() < 50  # chunked scan vs one scan


def test_word_marks_are_monotonic_and_cover_every_word(model):
    audio, marks = run(model, [w + " " for w in TEXT.split(" ")])
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


@pytest.mark.parametrize("hostile", ["", "   ", "😀" * 100, "<speak>x</speak>", "\x00\x1b", "你好", "9" * 200,
                                     "...!!!", "word " * 300])
def test_hostile_text_never_crashes(model, hostile):
    audio, marks = run(model, [hostile])
    assert audio.dtype == np.int16
    assert len(marks) == len(spoken_words(normalize_text(hostile))) or len(hostile) > 1000


def test_vocoder_chunking_is_exact():
    torch.manual_seed(1)
    features = torch.randn(2, 37, vocoder.N_FEATURES)
    features[..., 0] = torch.log(torch.tensor(120.0)) + 0.2 * features[..., 0]
    features[..., 1] = (features[..., 1] > 0).float()
    features[..., 2:2 + vocoder.N_BANDS] = features[..., 2:2 + vocoder.N_BANDS] - 12
    features[..., 2 + vocoder.N_BANDS:] = features[..., 2 + vocoder.N_BANDS:].sigmoid()
    whole, _ = vocoder.synthesize(features)
    state, pieces = None, []
    for size in (1, 5, 3, 11, 17):
        start = sum(p.shape[1] for p in pieces) // vocoder.HOP
        piece, state = vocoder.synthesize(features[:, start:start + size], state)
        pieces.append(piece)
    assert torch.allclose(torch.cat(pieces, 1), whole, atol=1e-5)
    assert torch.isfinite(whole).all()


def test_vocoder_noise_is_white():
    """The noise source is white (no tone, no DC) and depends only on the sample index:
    an earlier hash hid a 1.5 kHz tone and DC holding most of its power."""
    noise = vocoder.counter_noise(torch.tensor([0, 3 * 2 ** 32 + 7919]), 2 ** 15)
    assert torch.equal(vocoder.counter_noise(torch.tensor([1000]), 64)[0], noise[0, 1000:1064])
    # a table of NOISE_PERIOD samples (47.6 s), read round and round
    wrapped = vocoder.counter_noise(torch.tensor([vocoder.NOISE_PERIOD - 32]), 64)[0]
    assert torch.equal(wrapped[32:], noise[0, :32])
    assert not torch.equal(wrapped[:32], noise[0, :32])
    for x in noise.numpy():
        assert abs(x.mean()) < 0.05 and abs(x.var() - 1) < 0.05
        power = (np.abs(np.fft.rfft(x.reshape(-1, 1024) * np.hanning(1024), axis=1)) ** 2).mean(0)
        assert power.max() < 2.5 * np.median(power)
    assert abs(np.corrcoef(noise[0].numpy(), noise[1].numpy())[0, 1]) < 0.05


def test_harmonic_phases_are_minimum_phase():
    """The harmonics' phase offsets make a causal, front-loaded filter from the envelope
    (as WORLD's pulses are); a flat envelope has zero phase."""
    n_bins = vocoder.MIN_PHASE_FFT // 2 + 1
    freqs = torch.linspace(0, vocoder.SAMPLE_RATE / 2, n_bins)[None]
    assert vocoder._min_phase_at(torch.full((1, vocoder.N_BANDS), -9.0), freqs).abs().max() < 1e-4
    centers = torch.from_numpy(vocoder.band_centers_hz()).float()
    formants = sum(3 * torch.exp(-((centers - hz) / 150) ** 2) for hz in (500, 1500, 2500))
    log_bands = (formants - 10 - centers / 4000)[None]
    log_amp = 0.5 * vocoder._interp_bands(log_bands, freqs)
    phase = vocoder._min_phase_at(log_bands, freqs)
    response = torch.fft.irfft(torch.polar(torch.exp(log_amp), phase), n=vocoder.MIN_PHASE_FFT)[0] ** 2
    assert response[vocoder.MIN_PHASE_FFT // 2:].sum() < 0.01 * response.sum()
    zero_phase = torch.fft.irfft(torch.exp(log_amp), n=vocoder.MIN_PHASE_FFT)[0] ** 2
    assert zero_phase[vocoder.MIN_PHASE_FFT // 2:].sum() > 0.2 * zero_phase.sum()


def state_bytes(synth: Synthesizer) -> int:
    tensors = [synth.history] + [t for s in synth.encoder_state + synth.decoder_state for t in (s.conv, s.h)]
    v = synth.vocoder_state
    tensors += [v.phase, v.f0, v.amps, v.offsets, v.noise_tail, v.sample]
    return sum(t.numel() * t.element_size() for t in tensors)


def test_per_stream_state_is_bounded():
    synth = Synthesizer(TtsModel(TtsConfig()))  # the shipped size
    before = state_bytes(synth)
    synth.push_text("A sentence to move the state along. ")
    synth.end()
    list(synth.events())
    assert state_bytes(synth) == before <= 2 * 1024 * 1024


@pytest.mark.skipif(not SHIPPED_WEIGHTS.exists(), reason="no engine/weights/tts.safetensors yet (train with engine/train/train_tts.py)")
def test_shipped_weights_speak():
    model = load_model()
    audio, marks = synthesize_offline(model, "Thank you for calling.")
    assert len(audio) > 0.3 * vocoder.SAMPLE_RATE and len(marks) == 4
    assert np.abs(audio).max() > 100


def test_envelope_sharpening_keeps_level_tilt_and_energy():
    torch.manual_seed(3)
    envelope = torch.randn(5, vocoder.N_BANDS).cumsum(-1) * 0.3 - 8
    assert torch.equal(vocoder.sharpen_envelope(envelope, 1.0), envelope)
    sharpened = vocoder.sharpen_envelope(envelope, 1.5)
    log_width = torch.log(torch.from_numpy(np.gradient(vocoder.band_centers_hz())).float())
    assert torch.allclose(torch.logsumexp(sharpened + log_width, -1), torch.logsumexp(envelope + log_width, -1), atol=1e-4)
    # the detail above the first two cepstral coefficients grows by the gain; those two only shift by the energy fix
    n = torch.arange(vocoder.N_BANDS, dtype=torch.float64)
    dct = torch.cos(torch.pi / vocoder.N_BANDS * (n[None] + 0.5) * n[:, None]).float()
    before, after = envelope @ dct.T, sharpened @ dct.T
    assert torch.allclose(after[:, 2:], 1.5 * before[:, 2:], atol=1e-3 * before.abs().max())
    assert torch.allclose(after[:, 1], before[:, 1], atol=1e-3 * before.abs().max())

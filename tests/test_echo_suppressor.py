"""Echo suppression on real speech: Parley's voice fed back at -6 dB after 60-250 ms is
removed, while a caller talking at the same time (double talk) comes through."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.wavfile import read_wav
from gateway.echo_suppressor import (CROSSFADE, DELAY_SEARCH_FRAMES, FRAME, EchoSuppressor, fast_fft_size,
                                     percentile_by_column)

SPEECH = Path(__file__).parent / "data" / "speech"
ECHO_GAIN = 0.5  # -6 dB


def speech(name: str) -> np.ndarray:
    audio = read_wav(SPEECH / name, 16000).astype(np.float32)
    return audio * 32767 if np.abs(audio).max() <= 1.0 else audio


def run(reference: np.ndarray, inbound: np.ndarray) -> tuple[np.ndarray, EchoSuppressor]:
    """Feed both streams frame by frame, as a call does; returns the output realigned."""
    suppressor, out = EchoSuppressor(), []
    for start in range(0, len(inbound), FRAME):
        suppressor.add_reference(reference[start:start + FRAME].astype(np.int16))
        out.append(suppressor.process(inbound[start:start + FRAME].astype(np.int16)))
    return np.concatenate(out).astype(np.float32)[CROSSFADE:], suppressor  # the suppressor's latency


def scene(delay_ms: int, near: np.ndarray | None = None, near_at: int = 8000):
    far = speech("flite_slt-021.wav")
    delay = delay_ms * 16
    n = (len(far) + delay) // FRAME * FRAME + 10 * FRAME
    reference = np.zeros(n, np.float32)
    reference[:len(far)] = far
    echo = np.zeros(n, np.float32)
    echo[delay:delay + len(far)] = ECHO_GAIN * far
    talk = np.zeros(n, np.float32)
    if near is not None:
        talk[near_at:near_at + len(near)] = near[:n - near_at]
    return reference, echo, talk


@pytest.mark.parametrize("delay_ms", [60, 150, 250])
def test_parleys_own_voice_is_removed(delay_ms):
    reference, echo, _ = scene(delay_ms)
    out, suppressor = run(reference, echo)
    erle_db = 10 * np.log10(np.sum(echo[:len(out)] ** 2) / max(np.sum(out ** 2), 1e-9))
    assert erle_db >= 15, f"echo return loss enhancement {erle_db:.1f} dB"
    assert abs(suppressor.delay - delay_ms * 16) <= 16


@pytest.mark.parametrize("delay_ms", [60, 250])
def test_a_caller_talking_over_parley_comes_through(delay_ms):
    near = speech("flite_slt-020.wav")
    reference, echo, talk = scene(delay_ms, near)
    out, _ = run(reference, echo + talk)
    segment = slice(8000, 8000 + len(near))
    kept, original = out[segment], talk[:len(out)][segment]
    correlation = np.dot(kept, original) / np.sqrt(np.dot(kept, kept) * np.dot(original, original))
    energy_db = 10 * np.log10(np.sum(kept ** 2) / np.sum(original ** 2))
    assert correlation >= 0.8, correlation
    assert abs(energy_db) <= 3, energy_db


def test_on_a_line_without_echo_a_callers_first_syllable_over_parley_passes():
    """A browser cancels its own echo: while Parley speaks the inbound is silent. The caller's
    onset over the reply must reach the recognizer at once (a barge-in pauses on it), not
    only once it is louder than Parley's loudest output."""
    near = speech("flite_slt-020.wav")
    reference, _, talk = scene(60, near, near_at=24000)  # the caller starts 1.5 s into the reply
    out, suppressor = run(reference, talk)
    onset = 24000 + int(np.argmax(np.abs(near) > 0.05 * np.abs(near).max()))
    first = slice(onset, onset + 1600)  # its first 100 ms
    energy_db = 10 * np.log10(np.sum(out[first] ** 2) / np.sum(talk[first] ** 2))
    assert suppressor.delay is None and energy_db >= -3, energy_db


def test_on_a_noisy_line_without_echo_the_delay_search_is_not_run_every_frame(monkeypatch):
    """A browser's canceller leaves no echo to find, and its microphone's noise is sound
    enough to search: each search (three 40 000-point FFTs, ~1 ms on the event loop) fails,
    so it must come every DELAY_SEARCH_FRAMES frames, not every frame of Parley's voice."""
    reference, _, _ = scene(60)
    noise = np.random.default_rng(4).normal(0, 300, len(reference)).astype(np.float32)
    searches = []
    original = EchoSuppressor._estimate_delay
    monkeypatch.setattr(EchoSuppressor, "_estimate_delay", lambda self: searches.append(1) or original(self))
    _, suppressor = run(reference, noise)
    frames = len(reference) // FRAME
    assert suppressor.delay is None
    assert 0 < len(searches) <= frames // DELAY_SEARCH_FRAMES, (len(searches), frames)


def test_the_correlations_fft_size_is_the_least_5_smooth_one():
    def smooth(n: int) -> bool:
        for p in (2, 3, 5):
            while n % p == 0:
                n //= p
        return n == 1
    for n in [1, 2, 7, 97, 1000, 40000, 40640, 65537]:
        size = fast_fft_size(n)
        assert size >= n and smooth(size) and not any(smooth(m) for m in range(n, size)), (n, size)


def test_without_parley_speaking_audio_passes_unchanged():
    near = speech("flite_slt-020.wav")
    n = len(near) // FRAME * FRAME
    out, suppressor = run(np.zeros(n, np.float32), near[:n])
    assert suppressor.delay is None and suppressor.suppressed_frames == 0
    assert np.max(np.abs(out - near[:len(out)])) <= 2  # rounding only


def test_a_silent_parley_passes_the_caller_through_with_4_ms_latency():
    """While Parley is silent the output is the input, CROSSFADE samples (4 ms) late: the
    low-delay windows cost the recognizer no frame of waiting."""
    caller = np.random.default_rng(3).normal(0, 3000, FRAME * 40).astype(np.int16)
    out, _ = run(np.zeros(len(caller)), caller.astype(np.float32))
    assert CROSSFADE * 1000 // 16000 == 4
    np.testing.assert_allclose(out[FRAME:], caller[:len(out)][FRAME:], atol=1)


def test_percentiles_by_column_match_numpys_nanpercentile():
    rng = np.random.default_rng(1)
    values = rng.lognormal(size=(100, 28))
    values[rng.random(values.shape) < 0.3] = np.nan
    values[:, 5] = np.nan  # a band never seen
    values[:99, 7] = np.nan  # one value
    for q in (20, 50, 75):
        with np.errstate(all="ignore"), pytest.warns(RuntimeWarning):  # (numpy warns of the all-NaN column)
            expected = np.nanpercentile(values, q, axis=0)
        np.testing.assert_allclose(percentile_by_column(values, q), expected, rtol=1e-12, equal_nan=True)

"""Echo suppression: keep Parley's own voice out of what the recognizer hears.

Callers on speakerphones and many phones have no acoustic echo cancellation, so Parley's
reply comes back in their microphone 60-500 ms later. Unchecked, the recognizer hears
speech and Parley interrupts itself. Parley knows exactly what it sent (the far-end
reference), so per 20 ms frame it:

1. keeps the reference (the outbound audio at 16 kHz, from the pacer as each frame leaves)
   on the inbound frame timeline;
2. estimates the echo delay by cross-correlating the last REFERENCE_WINDOW_S of inbound
   audio with the reference (GCC-PHAT, re-estimated every DELAY_UPDATE_FRAMES while Parley
   speaks);
3. estimates the echo path's gain per frequency band from the inbound/reference magnitude
   ratio in bands where Parley's voice is strong (a low percentile over the last 2 s: the
   caller's own speech only ever adds energy);
4. subtracts the predicted echo spectrum from the inbound spectrum (Wiener-style gain with a
   floor; low-delay asymmetric windows, so the output lags the input by 4 ms), so echo is
   removed while a caller talking over Parley (double talk) keeps most of their energy;
5. fills what it removed with comfort noise at the line's own noise floor: gated bands of
   bare noise sound like hissing speech to a recognizer ("sss"), a steady floor does not;
6. tells whether the caller is audible over Parley (double talk): what it kept stands well
   above the noise floor. A "word" the recognizer makes of residual echo does not.

Until a delay is known, whatever is no louder than Parley's loudest recent output is taken
for echo, scaled by how loud the inbound has been against that output while Parley spoke
(a high percentile): on a line with no echo at all (a browser with echo cancellation) the
caller's first syllable over a reply passes at once instead of waiting to outshout it.

This is residual-echo suppression, not a full linear canceller: it needs no convergence
time, and its cost is two small FFTs per frame.
"""

from __future__ import annotations

from collections import deque
from typing import Deque, Optional

import numpy as np
# numpy loads these lazily, which would be on a call's first frame, on the event loop:
import numpy.fft  # noqa: F401
import numpy.random  # noqa: F401

SAMPLE_RATE = 16000
FRAME = 320  # 20 ms at 16 kHz: the playout clock's frame
WINDOW = 2 * FRAME  # analysis window: this frame and the one before
CROSSFADE = 64  # samples (4 ms) between one frame's output and the next: the suppressor's whole latency
MAX_DELAY_S = 0.5  # longest echo path searched
REFERENCE_WINDOW_S = 1.0  # audio correlated per delay estimate
DELAY_UPDATE_FRAMES = 10  # re-estimate the delay every 200 ms while the reference is active
DELAY_SEARCH_FRAMES = 4  # while none is known, look every 80 ms: a search costs ~1 ms, and on a line
# with no echo (a browser's own canceller) it never succeeds, so one a frame would cost 1.5 ms of
# every 20 ms of Parley's voice, on the event loop
MIN_CORRELATION = 0.12  # GCC-PHAT peak (normalised) needed to trust a delay estimate
PHAT_BETA = 0.7  # partial whitening: full PHAT (1.0) lets noise-only bins vote as loudly as speech
MIN_ACTIVE_FRACTION = 0.3  # share of the inbound window that must carry sound to estimate a delay
DELAY_TOLERANCE = 32  # samples (2 ms): a new estimate within this keeps the echo-gain history
ACTIVE_REFERENCE_RMS = 100.0  # int16 RMS above which Parley counts as speaking
GAIN_MEMORY_FRAMES = 100  # 2 s of per-band echo-gain estimates kept
COUPLING_PERCENTILE = 20  # of those estimates: robust to noise, still below the caller's speech
REFERENCE_BAND_SHARE = 0.03  # a band counts as carrying Parley's voice above this share of its loudest
CALLER_AUDIBLE_RATIO = 10.0  # kept energy this far above the noise floor's (10 dB): the caller is talking
CALLER_MEMORY_FRAMES = 25  # ... within the last 500 ms
OVER_SUBTRACTION = 2.0  # remove a bit more than the predicted echo: a safe margin
GAIN_FLOOR = 0.003  # about -50 dB: the listener is a recognizer, so musical noise is harmless
N_BANDS = 32
BLIND_MEMORY_FRAMES = 100  # 2 s of inbound / loudest-reference ratios while no delay is known
BLIND_PERCENTILE = 75  # of those: the echo's level, robust to a caller's first 500 ms in them
BLIND_MIN_FRAMES = 25  # ratios needed (500 ms of Parley's voice with any echo arrived) to trust them
BLIND_MARGIN = 4.0  # 12 dB above the echo's measured level is the caller


def _bands(n_bins: int) -> list[slice]:
    edges = np.unique(np.round(np.geomspace(1, n_bins, N_BANDS + 1)).astype(int))
    return [slice(int(a), int(b)) for a, b in zip(np.r_[0, edges[:-1]], edges)]


# Computed once at import: np.unique's first use loads numpy.ma, which must not happen on
# the event loop when a call's suppressor is built. The bands tile the bins in order, so a
# band's value spreads to its bins with np.repeat(values, BAND_SIZES).
BANDS = _bands(WINDOW // 2 + 1)
BAND_STARTS = np.array([band.start for band in BANDS])
BAND_SIZES = np.array([band.stop - band.start for band in BANDS])
assert BAND_STARTS[0] == 0 and np.all(BAND_SIZES > 0) and BAND_SIZES.sum() == WINDOW // 2 + 1


def band_levels(magnitude: np.ndarray) -> np.ndarray:
    """RMS of a magnitude spectrum per band."""
    return np.sqrt(np.add.reduceat(magnitude ** 2, BAND_STARTS) / BAND_SIZES)


def percentile_by_column(values: np.ndarray, q: float) -> np.ndarray:
    """np.nanpercentile(values, q, axis=0) (linear interpolation; NaN where a column has no
    value), in a few whole-array steps: numpy's own goes column by column in Python, which
    took most of the suppressor's time (4 ms a frame, on the event loop)."""
    ordered = np.sort(values, axis=0)  # NaNs sort last
    counts = np.count_nonzero(~np.isnan(values), axis=0)
    position = np.maximum(counts - 1, 0) * (q / 100)
    below = np.floor(position).astype(int)
    above = np.minimum(below + 1, np.maximum(counts - 1, 0))
    columns = np.arange(values.shape[1])
    low, high = ordered[below, columns], ordered[above, columns]
    out = low + (high - low) * (position - below)
    return np.where(counts > 0, out, np.nan)


class EchoSuppressor:
    def __init__(self) -> None:
        self._window, self._synthesis_window = low_delay_windows()
        history = int((MAX_DELAY_S + REFERENCE_WINDOW_S) * SAMPLE_RATE) + WINDOW
        self._reference = np.zeros(history, dtype=np.float32)  # newest last, same timeline as _inbound
        self._inbound = np.zeros(int(REFERENCE_WINDOW_S * SAMPLE_RATE) + WINDOW, dtype=np.float32)
        self._pending_reference: Deque[np.ndarray] = deque()
        self._band_gains: Deque[np.ndarray] = deque(maxlen=GAIN_MEMORY_FRAMES)
        self._reference_bands: Deque[np.ndarray] = deque(maxlen=int(MAX_DELAY_S * SAMPLE_RATE) // FRAME + 2)
        self._silent_bands = np.zeros(len(BANDS))
        self._overlap = np.zeros(CROSSFADE, dtype=np.float32)
        self._frames_since_estimate = 0
        self._noise_floor = np.zeros(WINDOW // 2 + 1)  # per-bin magnitude while Parley is silent
        self._comfort = np.random.default_rng(0)
        self.delay: Optional[int] = None  # echo delay in samples, once estimated
        self._candidate: Optional[int] = None  # a different delay seen once, awaiting confirmation
        self.suppressed_frames = 0
        self._kept_ratios: Deque[float] = deque(maxlen=CALLER_MEMORY_FRAMES)
        self._blind_ratios: Deque[np.ndarray] = deque(maxlen=BLIND_MEMORY_FRAMES)
        self._active_frames = 0  # consecutive frames with the reference active

    def add_reference(self, pcm16k: np.ndarray) -> None:
        """Audio Parley sent (16 kHz int16), as the pacer sends it."""
        self._pending_reference.append(pcm16k.astype(np.float32))

    def process(self, pcm: np.ndarray) -> np.ndarray:
        """One 20 ms inbound frame (16 kHz int16) -> the same frame with Parley's echo removed."""
        self._advance_reference()
        frame = pcm.astype(np.float32)
        self._inbound = np.concatenate([self._inbound[FRAME:], frame])
        if not self._reference_active():
            self._active_frames = 0
            return self._passthrough()
        self._active_frames += 1
        self._frames_since_estimate += 1
        if self._frames_since_estimate >= (DELAY_SEARCH_FRAMES if self.delay is None else DELAY_UPDATE_FRAMES):
            self._frames_since_estimate = 0
            self._update_delay(self._estimate_delay())
        if self.delay is None:
            return self._suppress_any_delay()
        return self._suppress()

    # -- internals --------------------------------------------------------------------------

    def _advance_reference(self) -> None:
        """Move one frame of sent audio onto the inbound timeline (silence if none was sent)."""
        need, parts = FRAME, []
        while need and self._pending_reference:
            head = self._pending_reference[0]
            parts.append(head[:need])
            need -= len(parts[-1])
            if len(head) <= len(parts[-1]):
                self._pending_reference.popleft()
            else:
                self._pending_reference[0] = head[len(parts[-1]):]
        self._reference[:-FRAME] = self._reference[FRAME:]  # in place: the history is ~1.5 s long
        newest, sent = self._reference[-FRAME:], FRAME - need
        if parts:
            newest[:sent] = np.concatenate(parts)
        newest[sent:] = 0.0
        latest = self._reference[-WINDOW:]
        if not latest.any():  # Parley silent (most frames of a call): the bands are zero, no FFT needed
            self._reference_bands.append(self._silent_bands)
            return
        spectrum = np.abs(np.fft.rfft(latest * self._window))
        self._reference_bands.append(band_levels(spectrum))

    def _reference_active(self) -> bool:
        """Parley spoke within the longest echo delay (so an echo may be arriving now)."""
        recent = self._reference[-int(MAX_DELAY_S * SAMPLE_RATE) - FRAME:]
        return bool(recent.any()) and float(np.sqrt(np.mean(recent ** 2))) > ACTIVE_REFERENCE_RMS / 4

    def _update_delay(self, estimate: Optional[int]) -> None:
        """Adopt the first estimate; later, move only when two estimates in a row agree on a
        new delay (one noisy correlation must not throw away a working alignment)."""
        if estimate is None:
            return
        if self.delay is not None and abs(estimate - self.delay) <= DELAY_TOLERANCE:
            self._candidate = None
            return
        if self.delay is not None and (self._candidate is None or abs(estimate - self._candidate) > DELAY_TOLERANCE):
            self._candidate = estimate
            return
        self._band_gains.clear()  # gains measured at another alignment mean nothing now
        self.delay, self._candidate = estimate, None

    def _estimate_delay(self) -> Optional[int]:
        """GCC-PHAT between the last second of inbound audio and the reference before it;
        None unless both carry sound and the peak stands out."""
        max_delay = int(MAX_DELAY_S * SAMPLE_RATE)
        n = len(self._inbound) - WINDOW
        y = self._inbound[-n:]
        if np.mean(np.abs(y) > ACTIVE_REFERENCE_RMS / 4) < MIN_ACTIVE_FRACTION:
            return None  # too little inbound sound yet (the echo has not arrived)
        x = self._reference[-(n + max_delay):]  # starts max_delay earlier than y
        cross = np.fft.rfft(x, CORRELATION_SIZE) * np.conj(np.fft.rfft(y, CORRELATION_SIZE))
        correlation = np.fft.irfft(cross / (np.abs(cross) ** PHAT_BETA + 1e-9), CORRELATION_SIZE)
        correlation /= np.sqrt(np.sum(x ** 2) * np.sum(y ** 2)) ** (1 - PHAT_BETA) + 1e-9
        # c[k] = sum_m x[m + k] y[m]: an echo D samples late peaks at k = max_delay - D.
        k = int(np.argmax(correlation[:max_delay + 1]))
        if correlation[k] < MIN_CORRELATION:
            return None
        return max_delay - k

    def _spectra(self) -> tuple[np.ndarray, np.ndarray]:
        y = np.fft.rfft(self._inbound[-WINDOW:] * self._window)
        end = len(self._reference) - self.delay
        r = np.fft.rfft(self._reference[end - WINDOW:end] * self._window)
        return y, r

    def _suppress(self) -> np.ndarray:
        y, r = self._spectra()
        y_mag, r_mag = np.abs(y), np.abs(r)
        band_y, band_r = band_levels(y_mag), band_levels(r_mag)
        active = band_r > max(1.0, REFERENCE_BAND_SHARE * band_r.max())  # bands where Parley's voice is
        if active.any():
            self._band_gains.append(np.where(active, band_y / np.maximum(band_r, 1e-6), np.nan))
        if not self._band_gains:
            return self._synthesize(y)
        echo = OVER_SUBTRACTION * np.repeat(self._coupling(), BAND_SIZES) * r_mag
        gains = np.clip(1.0 - (echo ** 2) / np.maximum(y_mag ** 2, 1e-6), GAIN_FLOOR, 1.0)
        return self._apply(y, gains)

    def _coupling(self) -> np.ndarray:
        """Echo-path gain per band: a low percentile of inbound/reference over recent frames
        (the caller's speech only ever raises the ratio; a minimum would chase noise)."""
        coupling = percentile_by_column(np.stack(self._band_gains), COUPLING_PERCENTILE)
        seen = ~np.isnan(coupling)
        typical = np.median(coupling[seen]) if seen.any() else 0.0
        return np.where(seen, coupling, typical)  # unseen bands: like the others

    def _apply(self, y: np.ndarray, gains: np.ndarray) -> np.ndarray:
        """Keep `gains` of the inbound spectrum; make up the rest with comfort noise."""
        if np.mean(gains) < 0.5:
            self.suppressed_frames += 1
        kept = y * gains
        floor_energy = float(np.sum(self._noise_floor ** 2)) + 1e-6
        self._kept_ratios.append(float(np.sum(np.abs(kept) ** 2)) / floor_energy)
        phase = np.exp(2j * np.pi * self._comfort.random(len(y)))
        return self._synthesize(kept + (1.0 - gains) * self._noise_floor * phase)

    @property
    def last_reference(self) -> np.ndarray:
        """The reference frame lined up with the last inbound frame (int16; what a call recording keeps)."""
        return np.clip(self._reference[-FRAME:], -32768, 32767).astype(np.int16)

    def caller_audible(self) -> bool:
        """Did the caller's own voice come through in the last 500 ms? (True when Parley has
        been silent: then there is no echo to mistake for them.)"""
        if not self._kept_ratios:
            return True
        return max(self._kept_ratios) > CALLER_AUDIBLE_RATIO

    def _suppress_any_delay(self) -> np.ndarray:
        """Before the delay is known (the first echo of a call): whatever is no louder than
        something Parley said within MAX_DELAY_S, band by band, is taken for echo."""
        y = np.fft.rfft(self._inbound[-WINDOW:] * self._window)
        y_mag = np.abs(y)
        loudest = np.max(np.stack(self._reference_bands), axis=0)
        levels = band_levels(y_mag)
        if self._active_frames * FRAME > MAX_DELAY_S * SAMPLE_RATE:  # any echo of it has arrived
            self._blind_ratios.append(levels / np.maximum(loudest, 1.0))
        echo_only = levels <= loudest * self._blind_coupling()
        return self._apply(y, np.where(np.repeat(echo_only, BAND_SIZES), GAIN_FLOOR, 1.0))

    def _blind_coupling(self) -> np.ndarray:
        """Per band, how loud an echo may be against Parley's loudest recent output: 1 until
        enough of Parley's voice has gone by, then what the inbound measured (with a margin)."""
        if len(self._blind_ratios) < BLIND_MIN_FRAMES:
            return np.ones(len(BANDS))
        measured = percentile_by_column(np.stack(self._blind_ratios), BLIND_PERCENTILE)
        return np.minimum(1.0, BLIND_MARGIN * measured)

    def _passthrough(self) -> np.ndarray:
        self._kept_ratios.clear()  # Parley is silent: whatever is heard is the caller
        y = np.fft.rfft(self._inbound[-WINDOW:] * self._window)
        # The floor follows quiet stretches quickly and loud ones (the caller talking) slowly.
        magnitude = np.abs(y)
        rate = np.where(magnitude < self._noise_floor, 0.1, 0.03)
        self._noise_floor += rate * (magnitude - self._noise_floor)
        return self._synthesize(y)

    def _synthesize(self, spectrum: np.ndarray) -> np.ndarray:
        """The frame that ends CROSSFADE samples ago: this block's output, cross-faded into the
        previous block's tail (low-delay weighted overlap-add)."""
        block = np.fft.irfft(spectrum, WINDOW) * self._synthesis_window
        out = block[WINDOW - FRAME - CROSSFADE:WINDOW - CROSSFADE].copy()
        out[:CROSSFADE] += self._overlap
        self._overlap = block[WINDOW - CROSSFADE:]
        return np.clip(out, -32768, 32767).astype(np.int16)


def fast_fft_size(n: int) -> int:
    """The smallest 2^a * 3^b * 5^c >= n: pocketfft is as quick at these as at a power of two,
    and the correlation's 40 000 samples need no more points, rather than 65 536."""
    best = 1 << max(n - 1, 0).bit_length()
    five = 1
    while five < best:
        three = five
        while three < best:
            size = three << max(0, (n - 1) // three).bit_length()  # three times the least power of two reaching n
            best = min(best, size)
            three *= 3
        five *= 5
    return best


# The delay search correlates the last REFERENCE_WINDOW_S of inbound audio with MAX_DELAY_S more
# of the reference: a linear (not circular) correlation needs the two lengths summed.
CORRELATION_SIZE = fast_fft_size(2 * int(REFERENCE_WINDOW_S * SAMPLE_RATE) + int(MAX_DELAY_S * SAMPLE_RATE))


def low_delay_windows() -> tuple[np.ndarray, np.ndarray]:
    """Asymmetric analysis and synthesis windows (Mauler & Martin, 2007) for a 20 ms hop.

    The analysis window spans two frames for frequency resolution but falls to zero within
    the last CROSSFADE samples; the synthesis window is zero except over the newest frame,
    shifted CROSSFADE samples earlier. Their product is a Hann cross-fade in, one, and a Hann
    cross-fade out, so consecutive blocks sum to exactly the input when nothing is removed,
    and the output lags the input by CROSSFADE samples instead of a whole frame (a symmetric
    50 % overlap-add's latency): the recognizer hears the caller 16 ms sooner."""
    rise = WINDOW - CROSSFADE
    analysis = np.concatenate([np.sqrt(np.hanning(2 * rise + 1)[:rise]),
                               np.sqrt(np.hanning(2 * CROSSFADE + 1)[CROSSFADE:2 * CROSSFADE])])
    fade = np.hanning(2 * CROSSFADE + 1)[:2 * CROSSFADE]  # periodic: a rising half plus a falling half sum to 1
    product = np.zeros(WINDOW)
    start = WINDOW - FRAME - CROSSFADE
    product[start:start + CROSSFADE] = fade[:CROSSFADE]
    product[start + CROSSFADE:WINDOW - CROSSFADE] = 1.0
    product[WINDOW - CROSSFADE:] = fade[CROSSFADE:]
    synthesis = np.divide(product, analysis, out=np.zeros(WINDOW), where=analysis > 1e-12)
    return analysis, synthesis

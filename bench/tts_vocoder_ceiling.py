"""The vocoder's ceiling: teacher audio -> analysis -> synthesis, judged like the student.

    nice -n 10 .venv/bin/python -m bench.tts_vocoder_ceiling --data data/tts-eval --limit 30 --json

For each held-out Piper joe utterance (NAME.wav + NAME.txt) it compares, with Whisper tiny.en
as the judge (WER through the STT scoring normaliser) and mel-cepstral distortion (MCD, dB,
over frames voiced in the original: cepstrum c1..c24 of the 60 mel-band log-amplitude
envelopes, 10/ln10 * sqrt(2 Σ Δc²), envelopes re-analysed by WORLD from each output; no time
warping, so timing differences count too):

- piper: the teacher audio itself;
- world_full: pyworld.synthesize from the full WORLD analysis (513-bin envelope, aperiodicity);
- world_coded: pyworld.synthesize from our coded features (60 mel bands, 6 ap bands), expanded back;
- torch_hn: engine/vocoder.py (harmonics + shaped noise) from the coded features: what the student drives;
- student: Parley's TTS model itself (--weights, default the shipped file) speaking the text,
  with its own predicted durations; its MCD is taken along a DTW alignment of the two
  cepstrum sequences (mcd_dtw_db), since its timing is its own.

It also fits the harmonic/noise gains of engine/vocoder.py (--calibrate) by matching frame energies.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from engine import vocoder
from engine.bench import whisper_judge
from engine.wer import normalize_for_wer
from engine.train.tts_data import analyse
from engine.train.voices import load_pyworld
from engine.wavfile import read_wav, write_wav
from engine.wer import word_error_rate

N_CEPSTRUM = 24


def mel_cepstrum(features: np.ndarray) -> np.ndarray:
    """Cepstrum of the log-amplitude mel-band envelope -> [frames, N_CEPSTRUM] (c1..c24):
    c_k = (1/N) Σ_n ln|S_n| cos(π k (n + ½) / N), i.e. the orthonormal DCT-II / sqrt(2N)."""
    from scipy.fft import dct

    log_amplitude = 0.5 * features[:, 2:2 + vocoder.N_BANDS]  # bands hold ln(power)
    return dct(log_amplitude, type=2, norm="ortho", axis=1)[:, 1:N_CEPSTRUM + 1] / np.sqrt(2 * vocoder.N_BANDS)


def mcd_db(reference: np.ndarray, test: np.ndarray) -> float:
    ref, out = analyse(reference), analyse(test)
    n = min(len(ref), len(out))
    voiced = ref[:n, 1] > 0.5
    if not voiced.any():
        return float("nan")
    diff = mel_cepstrum(ref[:n])[voiced] - mel_cepstrum(out[:n])[voiced]
    return float(np.mean(10.0 / np.log(10) * np.sqrt(2 * np.sum(diff ** 2, axis=1))))


def dtw_path(cost: np.ndarray) -> list[tuple[int, int]]:
    """Cheapest monotonic alignment through cost [n, m] (steps right, down, diagonal).

    Row i from row i-1 in one pass: D[i, j] = S[j] + min over k <= j of (A[k] - S[k-1]),
    with S the running sum of row i's costs and A[k] = min(D[i-1, k], D[i-1, k-1])."""
    n, m = cost.shape
    total = np.empty((n, m))
    total[0] = np.cumsum(cost[0])
    for i in range(1, n):
        above = np.minimum(total[i - 1], np.r_[np.inf, total[i - 1][:-1]])
        running = np.cumsum(cost[i])
        total[i] = running + np.minimum.accumulate(above - np.r_[0.0, running[:-1]])
    path, i, j = [(n - 1, m - 1)], n - 1, m - 1
    while i or j:
        steps = [(a, b) for a, b in ((i - 1, j - 1), (i - 1, j), (i, j - 1)) if a >= 0 and b >= 0]
        i, j = min(steps, key=lambda ab: total[ab])
        path.append((i, j))
    return path[::-1]


def mcd_dtw_db(reference: np.ndarray, test: np.ndarray) -> float:
    """MCD over the reference's voiced frames, each paired with the test frames DTW aligns to it."""
    ref, out = analyse(reference), analyse(test)
    c_ref, c_out = mel_cepstrum(ref), mel_cepstrum(out)
    distance = 10.0 / np.log(10) * np.sqrt(2 * np.sum((c_ref[:, None] - c_out[None]) ** 2, axis=2))
    pairs = [(i, j) for i, j in dtw_path(distance) if ref[i, 1] > 0.5]
    return float(np.mean([distance[i, j] for i, j in pairs])) if pairs else float("nan")


def world_full(x: np.ndarray) -> np.ndarray:
    pw = load_pyworld()
    x64 = x.astype(np.float64)
    frame_ms = 1000.0 * vocoder.HOP / vocoder.SAMPLE_RATE
    f0, t = pw.harvest(x64, vocoder.SAMPLE_RATE, frame_period=frame_ms, f0_floor=vocoder.F0_FLOOR, f0_ceil=vocoder.F0_CEIL)
    sp = pw.cheaptrick(x64, f0, t, vocoder.SAMPLE_RATE, fft_size=vocoder.N_FFT)
    ap = pw.d4c(x64, f0, t, vocoder.SAMPLE_RATE, fft_size=vocoder.N_FFT)
    return pw.synthesize(f0, sp, ap, vocoder.SAMPLE_RATE, frame_ms).astype(np.float32)


def world_coded(features: np.ndarray) -> np.ndarray:
    """Our coded features expanded back to WORLD's 513 bins, synthesized by WORLD."""
    pw = load_pyworld()
    bins = np.linspace(0, vocoder.SAMPLE_RATE / 2, vocoder.N_FFT // 2 + 1)
    centers = vocoder.band_centers_hz()
    sp = np.exp(np.stack([np.interp(bins, centers, row) for row in features[:, 2:2 + vocoder.N_BANDS]]))
    ap = features[:, 2 + vocoder.N_BANDS:][:, vocoder.ap_band_of_bins()]
    f0 = np.exp(features[:, 0]) * (features[:, 1] > 0.5)
    frame_ms = 1000.0 * vocoder.HOP / vocoder.SAMPLE_RATE
    return pw.synthesize(f0.astype(np.float64), np.ascontiguousarray(sp), np.ascontiguousarray(ap.astype(np.float64)),
                         vocoder.SAMPLE_RATE, frame_ms).astype(np.float32)


def torch_hn(features: np.ndarray) -> np.ndarray:
    audio, _ = vocoder.synthesize(torch.from_numpy(features)[None])
    # the vocoder sounds frame t during hop t from frame t-1's parameters: one hop late: shift back to align
    return audio[0, vocoder.HOP:].numpy()


def calibrate(items: list[tuple[np.ndarray, np.ndarray]]) -> dict:
    """Harmonic and noise gains that match the teacher's energy in voiced / unvoiced frames."""
    def frame_energy(x: np.ndarray, n: int) -> np.ndarray:
        x = np.pad(x, (0, max(0, n * vocoder.HOP - len(x))))[: n * vocoder.HOP]
        return (x.reshape(n, vocoder.HOP) ** 2).mean(1)

    ratios_v, ratios_u = [], []
    for audio, features in items:
        n = len(features)
        ref, out = frame_energy(audio, n), frame_energy(torch_hn(features), n)
        voiced = features[:, 1] > 0.5
        loud = ref > 1e-5
        ratios_v += list(ref[voiced & loud] / np.maximum(out[voiced & loud], 1e-12))
        ratios_u += list(ref[~voiced & loud] / np.maximum(out[~voiced & loud], 1e-12))
    return {"voiced_energy_ratio_median": float(np.median(ratios_v)) if ratios_v else None,
            "unvoiced_energy_ratio_median": float(np.median(ratios_u)) if ratios_u else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="data/tts-eval")
    parser.add_argument("--limit", type=int, default=30)
    parser.add_argument("--out", default="runs/tts/ceiling")
    parser.add_argument("--calibrate", action="store_true")
    parser.add_argument("--systems", default="piper,world_full,world_coded,torch_hn")
    parser.add_argument("--weights", default="", help="TTS weights for the student system (default: shipped)")
    parser.add_argument("--envelope-postfilter", type=float, help="the student's envelope sharpening gain (default: the engine's)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    wavs = sorted(Path(args.data).glob("*.wav"))[: args.limit]
    items = [(read_wav(w, vocoder.SAMPLE_RATE), w.with_suffix(".txt").read_text().strip()) for w in wavs]
    analysed = [(audio, analyse(audio[: len(audio) // vocoder.HOP * vocoder.HOP])) for audio, _ in items]
    if args.calibrate:
        print(json.dumps(calibrate(analysed)))
        return
    judge = whisper_judge("tiny.en")
    systems = {"piper": lambda a, f, t: a, "world_full": lambda a, f, t: world_full(a),
               "world_coded": lambda a, f, t: world_coded(f), "torch_hn": lambda a, f, t: torch_hn(f)}
    if "student" in args.systems.split(","):
        from engine.tts import load_model, synthesize_offline

        student = load_model(Path(args.weights) if args.weights else None)
        if args.envelope_postfilter is not None:
            student.envelope_postfilter = args.envelope_postfilter
        systems["student"] = lambda a, f, t: synthesize_offline(student, t)[0].astype(np.float32) / 32768
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"n": len(items), "judge": "whisper tiny.en int8 beam 5", "data": args.data}
    for name, system in ((n, systems[n]) for n in args.systems.split(",")):
        refs, hyps, mcds, seconds, synth_s = [], [], [], 0.0, 0.0
        for k, ((audio, features), (_, text)) in enumerate(zip(analysed, items)):
            started = time.perf_counter()
            y = system(audio, features, text)
            synth_s += time.perf_counter() - started
            seconds += len(y) / vocoder.SAMPLE_RATE
            if k < 5:
                write_wav(out / f"{name}_{k:03d}.wav", y / max(1e-6, np.abs(y).max()) * 0.9, vocoder.SAMPLE_RATE)
            refs.append(normalize_for_wer(text))
            hyps.append(normalize_for_wer(judge(y, vocoder.SAMPLE_RATE)))
            if name == "student":
                mcds.append(mcd_dtw_db(audio, y))
            elif name != "piper":
                mcds.append(mcd_db(audio, y))
        result[name] = {"wer": round(word_error_rate(refs, hyps), 4),
                        "mcd_db": round(float(np.nanmean(mcds)), 3) if mcds else 0.0,
                        "synth_rtf": round(synth_s / seconds, 4)}
        print(json.dumps({name: result[name]}), flush=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()

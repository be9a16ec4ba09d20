"""Engine capacity: how many concurrent full-duplex calls one batched Runtime carries in real time.

How it runs
-----------
One Runtime (engine/runtime/loop.py) with its own tick thread, as the gateway runs it, over the
shipped STT and TTS weights (or, when absent, randomly initialised models of the shipped
architectures: speed does not depend on weight values). For each N in --sizes it opens N
calls. Each call listens and speaks at once: a feeder thread pushes its STT stream 20 ms of
audio every 20 ms (real time, as the gateway's playout clock does) and drains its events,
and the call speaks replies: a sentence of --texts pushed at once to a TTS stream, its audio
drained as it comes, then a pause of 0.5-1.5 s, then the next sentence (--no-tts: listening
only). After --warm-up seconds the runtime's counters are reset and a --seconds window is
measured; then the streams close and the next N starts. A first, unmeasured row of the
smallest N warms up allocators and caches so that they do not count as per-stream memory.
Growing stops after the first row
that misses the budget (unless --no-stop).

Audio: the wav files in --audio DIR (any rate, resampled to 16 kHz), else synthesised voiced
signals (harmonics of a wandering pitch through moving formants, syllables and pauses). Each
stream starts at its own offset.

Figures per row
---------------
- lag_ms_p50/p95/max: from the push that completed a 40 ms model frame to that frame being
  stepped (waiting for the next tick, up to 40 ms, plus the tick's own work);
- behind_ms_end: how much pushed audio (whole frames) the most-behind stream still had waiting
  when the window ended; audio that accumulates here is late audio;
- tick_ms_p50/p99, ticks, late_ticks (ticks longer than the 40 ms budget), mean_batch (rows per
  batched step), feeder_late_ms_p99 (how late the feeder thread itself woke);
- ttfa_ms_p50/p95: a reply's text pushed -> its first audio out of the tick (runtime clock),
  replies: how many started in the window, late_audio_chunks: TTS chunks that came out after
  the time they would have started playing had the reply played from its first chunk on;
- state_bytes_per_stream (one call's slots of the preallocated pools: STT + TTS) and
  rss_growth_kb_per_stream (process RSS with N calls open minus before opening, over N:
  queues, buffers, allocator);
- cpu_pct: this process's CPU time over the window, % of one core;
- within_budget: lag_ms_p95 <= lag budget (2 frames, 80 ms), behind_ms_end <= lag budget,
  ttfa_ms_p95 <= 100 ms and no late audio chunk.
max_streams is the largest N within budget, all smaller sizes within budget too.

Usage: python bench/engine_capacity.py [--audio DIR] [--device cpu|cuda|auto] [--threads 1] [--no-tts] --json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import threading
import time
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from engine import tts  # noqa: E402
from engine.audio import FRAMES_PER_STEP, HOP_LENGTH, N_FFT, SAMPLE_RATE  # noqa: E402
from engine.runtime import Runtime, RuntimeSttStream, RuntimeTtsStream  # noqa: E402
from engine.stt import FRAME_S, PRECISIONS, SHIPPED_WEIGHTS, SttConfig, SttModel, load_model  # noqa: E402
from engine.wavfile import read_wav  # noqa: E402

PUSH_S = 0.02  # 20 ms pieces, the gateway's playout clock
PUSH_SAMPLES = int(PUSH_S * SAMPLE_RATE)
LAG_BUDGET_S = 2 * FRAME_S  # one tick period of waiting plus one tick of work
TTFA_BUDGET_S = 0.1
REPLY_PAUSE_S = (0.5, 1.5)  # between one reply's end and the next reply's text
DEFAULT_TEXTS = REPO / "bench" / "tts_heldout.txt"
SYNTH_VOICES, SYNTH_SECONDS = 8, 6.0


def log(message: str) -> None:
    print(f"[engine_capacity] {message}", file=sys.stderr, flush=True)


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def percentile_ms(values: list[float], q: float) -> Optional[float]:
    return round(float(np.percentile(values, q)) * 1000, 2) if values else None


# -- audio --------------------------------------------------------------------------------------

def synth_voice(seconds: float, seed: int) -> np.ndarray:
    """Speech-like float32: voiced syllables (pitch contour, moving formants) and pauses."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    f0 = rng.uniform(95, 230) * (1 + 0.12 * np.sin(2 * np.pi * rng.uniform(0.3, 0.8) * t))
    phase = 2 * np.pi * np.cumsum(f0) / SAMPLE_RATE
    syllable = np.floor(t / 0.2).astype(int)  # a new vowel every 200 ms
    formants = rng.uniform([300, 900, 2300], [850, 2300, 3200], size=(syllable[-1] + 1, 3))[syllable]
    voiced = np.zeros_like(t)
    for k in range(1, 30):
        harmonic = k * f0
        gain = sum(np.exp(-((harmonic - formants[:, i]) / 120.0) ** 2) for i in range(3)) / k ** 0.5
        voiced += gain * np.sin(k * phase) * (harmonic < 7000)
    talking = rng.random(syllable[-1] + 1)[syllable] > 0.2  # about one syllable in five is a pause
    envelope = np.sin(np.pi * (t % 0.2) / 0.2) ** 2 * talking
    audio = envelope * voiced + 0.01 * rng.normal(size=len(t))
    return (0.3 * audio / np.abs(audio).max()).astype(np.float32)


def load_audio(folder: Optional[str]) -> list[np.ndarray]:
    if not folder:
        return [synth_voice(SYNTH_SECONDS, seed) for seed in range(SYNTH_VOICES)]
    clips = [read_wav(path, SAMPLE_RATE) for path in sorted(Path(folder).glob("*.wav"))]
    clips = [clip for clip in clips if len(clip) >= SAMPLE_RATE]
    if not clips:
        raise SystemExit(f"{folder}: no wav files of at least 1 s")
    return clips


class Source:
    """One stream's endless audio: a clip, looped, from its own offset."""

    def __init__(self, clip: np.ndarray, offset: int) -> None:
        self.clip, self.position = clip, offset % len(clip)

    def next(self, samples: int) -> np.ndarray:
        indices = (self.position + np.arange(samples)) % len(self.clip)
        self.position = (self.position + samples) % len(self.clip)
        return (self.clip[indices] * 32767).astype(np.int16)


# -- one row --------------------------------------------------------------------------------------

def frames_behind(stream: RuntimeSttStream) -> int:
    """Model frames this stream's pushed audio completes, minus the frames stepped so far."""
    mels = 0 if stream.pushed_samples < N_FFT else 1 + (stream.pushed_samples - N_FFT) // HOP_LENGTH
    return mels // FRAMES_PER_STEP - stream.decoder.frame


class Speaker:
    """One call's replies: a sentence pushed at once, its audio drained, a pause, the next."""

    def __init__(self, runtime: Runtime, name: str, texts: list[str], seed: int) -> None:
        self.runtime, self.name, self.texts = runtime, name, texts
        self.rng = np.random.default_rng(seed)
        self.stream: Optional[RuntimeTtsStream] = None
        self.next_at = time.perf_counter() + self.rng.uniform(0, REPLY_PAUSE_S[1])  # staggered starts
        self.failed = 0

    def service(self, now: float) -> None:
        if self.stream is None:
            if now >= self.next_at:
                self.stream = self.runtime.open_tts(self.name)
                self.stream.push_text(self.texts[int(self.rng.integers(len(self.texts)))])
                self.stream.end()
            return
        self.stream.poll()
        if self.stream.closed:
            self.failed += self.stream.error is not None
            self.stream = None
            self.next_at = now + self.rng.uniform(*REPLY_PAUSE_S)

    def close(self) -> None:
        if self.stream is not None:
            self.stream.cancel()


class Feeder(threading.Thread):
    """Every 20 ms: 20 ms of audio to every STT stream, events drained, replies serviced."""

    def __init__(self, streams: list[RuntimeSttStream], sources: list[Source], speakers: list[Speaker]) -> None:
        super().__init__(name="feeder", daemon=True)
        self.streams, self.sources, self.speakers = streams, sources, speakers
        self.lateness: list[float] = []
        self.stop = threading.Event()

    def run(self) -> None:
        due = time.perf_counter()
        while not self.stop.is_set():
            now = time.perf_counter()
            self.lateness.append(max(0.0, now - due))
            for stream, source in zip(self.streams, self.sources):
                stream.push(source.next(PUSH_SAMPLES))
                stream.poll()
            for speaker in self.speakers:
                speaker.service(now)
            due += PUSH_S
            self.stop.wait(max(0.0, due - time.perf_counter()))


def run_row(runtime: Runtime, n: int, clips: list[np.ndarray], texts: list[str], args: argparse.Namespace) -> dict:
    rss_before = rss_bytes()
    streams = [runtime.open_stt(f"bench-{i}") for i in range(n)]
    sources = [Source(clips[i % len(clips)], i * 7919) for i in range(n)]
    speakers = [Speaker(runtime, f"bench-{i}", texts, seed=i) for i in range(n)] if runtime.tts else []
    feeder = Feeder(streams, sources, speakers)
    feeder.start()
    time.sleep(args.warm_up)
    runtime.metrics.reset()
    feeder.lateness.clear()
    cpu_start, wall_start = time.process_time(), time.perf_counter()
    time.sleep(args.seconds)
    behind = max(frames_behind(s) for s in streams) * FRAME_S
    cpu, wall = time.process_time() - cpu_start, time.perf_counter() - wall_start
    _, lags, counters = runtime.metrics.snapshot()
    stats = runtime.stats()
    rss_with_streams = rss_bytes()
    feeder.stop.set()
    feeder.join()
    failed = sum(s.error is not None for s in streams) + sum(speaker.failed for speaker in speakers)
    for stream in streams:
        stream.close()
    for speaker in speakers:
        speaker.close()
    lag_p95 = percentile_ms(lags, 95)
    ttfas = counters["ttfas"]
    row = {
        "n": n, "seconds": round(wall, 2), "frames": counters["frames"],
        "lag_ms_p50": percentile_ms(lags, 50), "lag_ms_p95": lag_p95,
        "lag_ms_max": round(max(lags) * 1000, 2) if lags else None,
        "behind_ms_end": round(behind * 1000, 1),
        "tick_ms_p50": stats.tick_ms_p50, "tick_ms_p99": stats.tick_ms_p99,
        "ticks": stats.ticks, "late_ticks": stats.late_ticks,
        "mean_batch": round(stats.mean_batch, 2) if stats.mean_batch else None,
        "feeder_late_ms_p99": percentile_ms(feeder.lateness, 99),
        "state_bytes_per_stream": stats.state_bytes_per_stream,
        "rss_growth_kb_per_stream": round((rss_with_streams - rss_before) / 1024 / n, 1),
        "cpu_pct": round(100 * cpu / wall, 1), "streams_failed": failed,
        "ttfa_ms_p50": percentile_ms(ttfas, 50), "ttfa_ms_p95": percentile_ms(ttfas, 95),
        "replies": len(ttfas), "late_audio_chunks": counters["late_audio_chunks"],
    }
    speech_ok = not speakers or (bool(ttfas) and row["ttfa_ms_p95"] <= TTFA_BUDGET_S * 1000
                                 and row["late_audio_chunks"] == 0)
    row["within_budget"] = (failed == 0 and lag_p95 is not None and lag_p95 <= LAG_BUDGET_S * 1000
                            and behind <= LAG_BUDGET_S and speech_ok)
    return row


def build_model(path: Optional[str]) -> tuple[SttModel, str]:
    if path or SHIPPED_WEIGHTS.exists():
        return load_model(Path(path) if path else None), str(path or SHIPPED_WEIGHTS)
    torch.manual_seed(0)
    return SttModel(SttConfig()).eval(), "random init, shipped architecture (no shipped weights yet)"


def build_tts_model() -> tuple[tts.TtsModel, str]:
    if tts.SHIPPED_WEIGHTS.exists():
        return tts.load_model(), str(tts.SHIPPED_WEIGHTS)
    torch.manual_seed(0)
    return tts.TtsModel(tts.TtsConfig()).eval(), "random init, shipped architecture (no shipped weights yet)"


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/engine_capacity.py")
    parser.add_argument("--sizes", default="1,4,16,64,256")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured window per row (every call starts a reply in it)")
    parser.add_argument("--warm-up", type=float, default=2.0, help="seconds fed before each window")
    parser.add_argument("--audio", help="folder of wav files (default: synthesised voices)")
    parser.add_argument("--weights", help="STT weights (default: shipped if present, else random init)")
    parser.add_argument("--texts", default=str(DEFAULT_TEXTS), help="reply sentences, one per line")
    parser.add_argument("--no-tts", action="store_true", help="listening only: no replies")
    parser.add_argument("--lm", default="shipped",
                        help="word LM of the transcripts: shipped (default), none (greedy) or an ARPA file")
    parser.add_argument("--turns", default="shipped",
                        help="turn-completion table for turn ends: shipped (default), none (the end-of-turn head alone) or a file")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--precision", default="auto", choices=PRECISIONS,
                        help="how the STT model steps: auto (int8 on CPU), float or int8")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--no-stop", action="store_true", help="run every size even after a miss")
    parser.add_argument("--note", help="free text stored in the JSON (e.g. what else the machine ran)")
    parser.add_argument("--json", action="store_true", help="print one JSON object (the default output)")
    args = parser.parse_args(argv)
    sizes = [int(size) for size in args.sizes.split(",")]
    load_start = round(os.getloadavg()[0], 2)

    model, weights_source = build_model(args.weights)
    tts_model, tts_source = (None, None) if args.no_tts else build_tts_model()
    runtime = Runtime(model, tts_model=tts_model, max_streams=max(sizes), device=args.device,
                      num_threads=args.threads, lm=None if args.lm == "none" else args.lm,
                      turns=None if args.turns == "none" else args.turns, precision=args.precision)
    runtime.warm_up()
    runtime.start()
    clips = load_audio(args.audio)
    texts = [line.strip() for line in Path(args.texts).read_text().splitlines() if line.strip()]
    rows = []
    try:
        run_row(runtime, sizes[0], clips, texts, argparse.Namespace(warm_up=0.2, seconds=1.0))  # unmeasured
        for n in sizes:
            log(f"N={n}: {args.warm_up:g} s warm-up + {args.seconds:g} s window")
            rows.append(run_row(runtime, n, clips, texts, args))
            log(json.dumps(rows[-1]))
            if not rows[-1]["within_budget"] and not args.no_stop:
                break
    finally:
        runtime.close()
    max_streams = 0
    for row in rows:
        if not row["within_budget"]:
            break
        max_streams = row["n"]
    result = {
        "benchmark": "engine_capacity", "device": str(runtime.device),
        "dtype": str(runtime.dtype).replace("torch.", ""), "threads": torch.get_num_threads(),
        "max_streams": max_streams,
        "tick_budget_ms": FRAME_S * 1000, "lag_budget_ms": LAG_BUDGET_S * 1000,
        "ttfa_budget_ms": None if args.no_tts else TTFA_BUDGET_S * 1000,
        "weights": weights_source, "tts_weights": tts_source, "lm": args.lm, "turns": args.turns, "precision": args.precision,
        "audio": args.audio or f"{SYNTH_VOICES} synthesised voices", "texts": None if args.no_tts else args.texts,
        "machine": {"cpu_count": os.cpu_count(), "load_avg_1m_start": load_start,
                    "load_avg_1m_end": round(os.getloadavg()[0], 2),
                    "platform": platform.platform(), "torch": torch.__version__},
        "note": args.note,
        "rows": rows,
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

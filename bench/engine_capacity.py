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

Audio: the wav files in --audio DIR (any rate, resampled to 16 kHz; each clip followed by
CLIP_GAP_S of silence, so callers' turns end), else synthesised voiced signals (harmonics of a
wandering pitch through moving formants, syllables and pauses). Each stream starts at its own
offset.

Words: --stt-model whisper-tiny.en (the default, as the gateway serves) reads them with
Whisper on --readers reading threads beside the tick (engine/whisper_stream.py), the SSM and
the VAD hearing speech start and pauses; `ssm` is Parley's SSM alone.

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
- cpu_pct: this process's CPU time over the window, % of one core; reply_audio_s: the replies'
  audio drained in the window; with --no-stt (speaking only: no caller audio is heard, so all
  the CPU is the voice's) cpu_s_per_reply_audio_s, one reply stream's real-time factor in CPU
  seconds with N replies rendering at once;
- with Whisper reading the words (--audio clips, cut to their speech by the VAD):
  turn_end_ms_p50/p95, from a clip's last sample pushed to the first EndOfTurn drained after
  it (the turn rule waits 0.2-1.0 s of quiet on purpose, engine/whisper_stream.py, so this is
  that wait plus any queueing for the reader), turns_ended, turns_missed (a clip end with no
  EndOfTurn before the next clip's end); partials_per_turn; readings, reading_wait_ms_p95 (a reading's time in
  the reader's queue), reader_busy_pct (reading time over the window, % of the readers);
- within_budget: lag_ms_p95 <= lag budget (2 frames, 80 ms), behind_ms_end <= lag budget,
  ttfa_ms_p95 <= 100 ms, no late audio chunk, and (Whisper on clips) turn_end_ms_p95 <=
  TURN_END_BUDGET_S and no turn missed.
max_streams is the largest N within budget, all smaller sizes within budget too.

Usage: python bench/engine_capacity.py [--audio DIR] [--stt-model whisper-tiny.en|ssm] [--device cpu|cuda|auto]
       [--threads 1] [--no-tts | --no-stt] --json
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
from typing import Optional, Sequence

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench.real_turns import speech_span  # noqa: E402
from engine import tts  # noqa: E402
from engine.interface import Audio, EndOfTurn, Partial  # noqa: E402
from engine.models import STT_MODELS, WHISPER  # noqa: E402
from engine.audio import FRAMES_PER_STEP, HOP_LENGTH, N_FFT, SAMPLE_RATE  # noqa: E402
from engine.runtime import Runtime, RuntimeSttStream, RuntimeTtsStream  # noqa: E402
from engine.stt import FRAME_S, PRECISIONS, SHIPPED_WEIGHTS, SttConfig, SttModel, load_model  # noqa: E402
from engine.vad import SileroVad  # noqa: E402
from engine.wavfile import read_wav  # noqa: E402
from engine.whisper import WhisperReader  # noqa: E402
from engine.whisper_readers import ReadingWorker  # noqa: E402
from tests.kit.memory import rss_mib  # noqa: E402

PUSH_S = 0.02  # 20 ms pieces, the gateway's playout clock
PUSH_SAMPLES = int(PUSH_S * SAMPLE_RATE)
LAG_BUDGET_S = 2 * FRAME_S  # one tick period of waiting plus one tick of work
TTFA_BUDGET_S = 0.1
REPLY_PAUSE_S = (0.5, 1.5)  # between one reply's end and the next reply's text
DEFAULT_TEXTS = REPO / "bench" / "tts_heldout.txt"
SYNTH_VOICES, SYNTH_SECONDS = 8, 6.0
CLIP_GAP_S = 2.0  # silence after each --audio clip: the caller waits for an answer
TURN_END_BUDGET_S = 1.5  # the longest quiet the turn rule waits (1.0 s) plus a reading and some queueing


def log(message: str) -> None:
    print(f"[engine_capacity] {message}", file=sys.stderr, flush=True)


def percentile_ms(values: Sequence[float], q: float) -> Optional[float]:
    return round(float(np.percentile(values, q)) * 1000, 2) if len(values) else None


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
    vad = SileroVad()
    clips = [read_wav(path, SAMPLE_RATE) for path in sorted(Path(folder).glob("*.wav"))]
    clips = [clip[slice(*speech_span(clip, vad))] for clip in clips]  # its turn ends where the speech does
    clips = [clip for clip in clips if len(clip) >= SAMPLE_RATE]
    if not clips:
        raise SystemExit(f"{folder}: no wav files of at least 1 s")
    return clips


class Source:
    """One stream's endless audio: a clip (and its gap), looped, from its own offset;
    `end_times`: when each of the clip's ends was pushed (perf_counter), for turn-end timing."""

    def __init__(self, clip: np.ndarray, offset: int, gap_s: float = 0.0) -> None:
        self.speech = len(clip)
        self.clip = np.concatenate([clip, np.zeros(int(gap_s * SAMPLE_RATE), np.float32)])
        self.position = offset % len(self.clip)
        self.end_times: list[float] = []

    def next(self, samples: int, now: float = 0.0) -> np.ndarray:
        start, stop = self.position, self.position + samples
        if len(self.clip) > self.speech and (start < self.speech <= stop
                                             or start < self.speech + len(self.clip) <= stop):
            self.end_times.append(now)
        indices = (start + np.arange(samples)) % len(self.clip)
        self.position = stop % len(self.clip)
        return (self.clip[indices] * 32767).astype(np.int16)


class TurnClock:
    """One stream's turns as its caller sees them: the first EndOfTurn after each clip end
    (by the clip end's index in Source.end_times), and the partials."""

    def __init__(self) -> None:
        self.turn_ends: dict[int, float] = {}  # clip end index -> seconds to its EndOfTurn
        self.partials = 0

    def drain(self, events: list, source: Source, now: float) -> None:
        for event in events:
            if isinstance(event, Partial):
                self.partials += 1
            elif isinstance(event, EndOfTurn) and source.end_times:
                self.turn_ends.setdefault(len(source.end_times) - 1, now - source.end_times[-1])


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
        self.audio_samples = 0  # reply audio drained (TTS sample rate)

    def service(self, now: float) -> None:
        if self.stream is None:
            if now >= self.next_at:
                self.stream = self.runtime.open_tts(self.name)
                self.stream.push_text(self.texts[int(self.rng.integers(len(self.texts)))])
                self.stream.end()
            return
        self.audio_samples += sum(len(event.pcm) for event in self.stream.poll() if isinstance(event, Audio))
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
        self.clocks = [TurnClock() for _ in streams]
        self.lateness: list[float] = []
        self.stop = threading.Event()

    def run(self) -> None:
        due = time.perf_counter()
        while not self.stop.is_set():
            now = time.perf_counter()
            self.lateness.append(max(0.0, now - due))
            for stream, source, clock in zip(self.streams, self.sources, self.clocks):
                stream.push(source.next(PUSH_SAMPLES, now))
                clock.drain(stream.poll(), source, time.perf_counter())
            for speaker in self.speakers:
                speaker.service(now)
            due += PUSH_S
            self.stop.wait(max(0.0, due - time.perf_counter()))


def run_row(runtime: Runtime, n: int, clips: list[np.ndarray], texts: list[str], args: argparse.Namespace) -> dict:
    rss_before = rss_mib()
    streams = [] if args.no_stt else [runtime.open_stt(f"bench-{i}") for i in range(n)]
    worker = runtime.stt.words[0] if runtime.stt.words is not None and not args.no_stt else None
    gap_s = CLIP_GAP_S if worker is not None and args.audio else 0.0
    sources = [Source(clips[i % len(clips)], i * 7919, gap_s) for i in range(n)]
    speakers = [Speaker(runtime, f"bench-{i}", texts, seed=i) for i in range(n)] if runtime.tts else []
    feeder = Feeder(streams, sources, speakers)
    feeder.start()
    time.sleep(args.warm_up)
    runtime.metrics.reset()
    feeder.lateness.clear()
    feeder.clocks = [TurnClock() for _ in streams]
    readings_start = (worker.readings, worker.read_seconds) if worker is not None else (0, 0.0)
    if worker is not None:
        worker.waits.clear()
    audio_start = [speaker.audio_samples for speaker in speakers]
    cpu_start, wall_start = time.process_time(), time.perf_counter()
    time.sleep(args.seconds)
    behind = max((frames_behind(s) for s in streams), default=0) * FRAME_S
    reply_audio_s = sum(s.audio_samples - a for s, a in zip(speakers, audio_start)) / tts.SAMPLE_RATE
    cpu, wall = time.process_time() - cpu_start, time.perf_counter() - wall_start
    _, lags, counters = runtime.metrics.snapshot()
    stats = runtime.stats()
    rss_with_streams = rss_mib()
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
        "lag_ms_max": round(float(np.max(lags)) * 1000, 2) if len(lags) else None,
        "behind_ms_end": round(behind * 1000, 1),
        "tick_ms_p50": stats.tick_ms_p50, "tick_ms_p99": stats.tick_ms_p99,
        "ticks": stats.ticks, "late_ticks": stats.late_ticks,
        "mean_batch": round(stats.mean_batch, 2) if stats.mean_batch else None,
        "feeder_late_ms_p99": percentile_ms(feeder.lateness, 99),
        "state_bytes_per_stream": stats.state_bytes_per_stream,
        "rss_growth_kb_per_stream": round((rss_with_streams - rss_before) * 1024 / n, 1),
        "cpu_pct": round(100 * cpu / wall, 1), "streams_failed": failed,
        "ttfa_ms_p50": percentile_ms(ttfas, 50), "ttfa_ms_p95": percentile_ms(ttfas, 95),
        "replies": len(ttfas), "late_audio_chunks": counters["late_audio_chunks"],
        "reply_audio_s": round(reply_audio_s, 1),
        # --no-stt: the process's CPU is all the voice's, so this is one reply stream's RTF (CPU)
        "cpu_s_per_reply_audio_s": round(cpu / reply_audio_s, 4) if args.no_stt and reply_audio_s else None,
    }
    if worker is not None:
        row.update(reading_figures(worker, readings_start, (wall_start, wall_start + wall), feeder.clocks, sources))
    words_ok = gap_s == 0 or (row["turn_end_ms_p95"] is not None and row["turn_end_ms_p95"] <= TURN_END_BUDGET_S * 1000
                              and row["turns_missed"] == 0)
    speech_ok = not speakers or (len(ttfas) > 0 and row["ttfa_ms_p95"] <= TTFA_BUDGET_S * 1000
                                 and row["late_audio_chunks"] == 0)
    listening_ok = not streams or (lag_p95 is not None and lag_p95 <= LAG_BUDGET_S * 1000 and behind <= LAG_BUDGET_S)
    row["within_budget"] = failed == 0 and listening_ok and speech_ok and words_ok
    return row


def reading_figures(worker: ReadingWorker, start: tuple[int, float], window: tuple[float, float],
                    clocks: list[TurnClock], sources: list[Source]) -> dict:
    """Whisper's side of a row: how soon callers' turns ended (clip ends in the window, at least
    TURN_END_BUDGET_S before its end), how many partials, how busy the readers were."""
    opened, closed = window
    delays, missed = [], 0
    for clock, source in zip(clocks, sources):
        for k, at in enumerate(source.end_times):
            if opened <= at <= closed - TURN_END_BUDGET_S:
                if k in clock.turn_ends:
                    delays.append(clock.turn_ends[k])
                else:
                    missed += 1
    readings, read_seconds = worker.readings - start[0], worker.read_seconds - start[1]
    return {"turn_end_ms_p50": percentile_ms(delays, 50), "turn_end_ms_p95": percentile_ms(delays, 95),
            "turns_ended": len(delays), "turns_missed": missed,
            "partials_per_turn": round(sum(c.partials for c in clocks) / max(1, len(delays)), 1),
            "readings": readings, "reading_wait_ms_p95": percentile_ms(list(worker.waits), 95),
            "reader_busy_pct": round(100 * read_seconds / ((closed - opened) * worker.threads), 1)}


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
    parser.add_argument("--stt-model", default=WHISPER, choices=STT_MODELS,
                        help="who reads the words: Whisper beside the SSM (the default, as served) or the SSM alone")
    parser.add_argument("--readers", type=int, default=1, help="Whisper reading threads (the gateway's default: 1)")
    parser.add_argument("--weights", help="STT weights (default: shipped if present, else random init)")
    parser.add_argument("--texts", default=str(DEFAULT_TEXTS), help="reply sentences, one per line")
    parser.add_argument("--no-tts", action="store_true", help="listening only: no replies")
    parser.add_argument("--no-stt", action="store_true",
                        help="speaking only: no caller audio, so CPU per reply audio second is the voice's alone")
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
    if args.no_tts and args.no_stt:
        parser.error("--no-tts and --no-stt leave nothing to measure")
    sizes = [int(size) for size in args.sizes.split(",")]
    load_start = round(os.getloadavg()[0], 2)

    model, weights_source = build_model(args.weights)
    tts_model, tts_source = (None, None) if args.no_tts else build_tts_model()
    runtime = Runtime(model, tts_model=tts_model, max_streams=max(sizes), device=args.device,
                      num_threads=args.threads, lm=None if args.lm == "none" else args.lm,
                      turns=None if args.turns == "none" else args.turns, precision=args.precision,
                      words=(ReadingWorker(WhisperReader(), args.readers), SileroVad()) if args.stt_model == WHISPER else None)
    runtime.warm_up()
    runtime.start()
    clips = load_audio(args.audio)
    texts = [line.strip() for line in Path(args.texts).read_text().splitlines() if line.strip()]
    rows = []
    try:
        run_row(runtime, sizes[0], clips, texts, argparse.Namespace(warm_up=0.2, seconds=1.0, audio=args.audio,
                                                                        no_stt=args.no_stt))  # unmeasured
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
        "stt_model": args.stt_model, "readers": args.readers if args.stt_model == WHISPER else None,
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

"""Voice-to-voice latency: from the end of a caller's words to the first sound of Parley's
reply, heard at the browser; and barge-in stop latency: from the caller starting to talk
over a reply to Parley's audio being gone at the browser.

Over 400 lines, kept as one script: the run and its offline analysis share one clock and one
set of thresholds and are read together; a quarter of the file is this description and the
page's recorder (JavaScript strings).

How it runs
-----------
1. Builds a caller WAV: a lead-in (the greeting plays meanwhile), then --turns utterances of
   held-out voices (from --speech DIR: NAME.wav files; default bench/data/caller-turns: eight
   held-out sentences by three held-out voices, flite slt, espeak and a Kokoro mixture), each
   after --gap-s of silence for the reply to the one before, except --barge-ins of them
   (every other one, from the second): they start --barge-in-after-s after the turn before
   them ends, while Parley is answering it.
2. Starts a real gateway process in conversation mode (the scripted responder by default,
   its contact-center flow without the actions that end the call,
   the STT and TTS weights given by --stt-weights and --tts-weights, else the shipped ones) on
   a free loopback port.
3. Headless Chromium (Debian chromium via Playwright) calls it from the demo page with the
   WAV as its fake microphone. One AudioWorklet records, sample-aligned on one WebAudio
   clock, two channels: the page's own microphone track (what the caller says) and the
   output of the page's playback graph (what the caller hears of Parley, including the
   page's cut of a paused reply); the same clock stamps the arrival of each
   reply's events (response.audio.start / .end, response.interrupted).
4. Offline: the caller's utterances (start, end) are found in channel 0 (energy above
   SPEECH_DBFS), Parley's audio in channel 1 (10 ms frames above ONSET_DBFS).
   - v2v = reply onset - turn end, for every caller turn (barge-ins too): the first loud
     frame after a turn end, before the next turn's end. A turn whose end finds Parley
     still talking (a barge-in that did not stop it, or a reply longer than --gap-s) has no
     clean onset and is not counted.
   - Barge-in trials are the caller's onsets while a reply is playing (its audio.start
     arrived, not its end, and Parley audible in the 300 ms before). A trial stopped if the
     reply's response.interrupted arrived; its stop latency = the end of Parley's last loud
     frame (up to STOP_TAIL_S after that event, before the next reply) - the caller's onset.
     Parley barges in only on a recognized word over its voice (gateway/conversation.py),
     so the latency includes hearing that word; trials the recognizer missed are counted
     as not stopped.

Output: one JSON object with v2v_ms_p50, v2v_ms_p95, turns (replies measured), turns_sent,
bargein_stop_ms_p50, bargein_stop_ms_p95, bargein_event_ms_p50 (onset -> response.interrupted
at the page), bargein_scheduled, bargein_trials, bargein_stopped, bargein_not_stopped, and
the per-stage medians of the gateway's metrics.turn events (with the page's
browser_playout_ms). Progress on stderr.
Usage: python bench/voice_to_voice.py --turns 20 --barge-ins 10 --tts-weights runs/tts/ckpt.pt --json
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from engine.audio import to_float  # noqa: E402
from engine.wavfile import read_wav  # noqa: E402
from tests.kit.ports import free_port  # noqa: E402
from tests.kit.processes import kill, start_server, wait_ready  # noqa: E402
from tests.kit.signals import resample, write_wav  # noqa: E402
from tests.kit.browser import CHROMIUM, chromium_args  # noqa: E402
from tests.kit.metrics import scrape  # noqa: E402

RATE = 48000
FRAME_S = 0.01  # analysis frames
SPEECH_DBFS = -40.0  # caller energy above this is speech
ONSET_DBFS = -45.0  # Parley's audio above this is a reply
MIN_PAUSE_S = 1.0  # shorter pauses do not split a caller turn (the clips hold mid-turn pauses up to 0.9 s)
TALKING_OVER_S = 0.3  # a caller onset is a barge-in when Parley was audible this long before it
STOP_TAIL_S = 1.0  # Parley's audio after response.interrupted arrived still counts as not yet stopped
STAGES = ("end_of_turn_ms", "responder_first_token_ms", "tts_first_audio_ms", "first_frame_ms", "total_ms",
          "browser_playout_ms")
REPLY_EVENTS = ("response.audio.start", "response.audio.end", "response.paused", "response.interrupted", "metrics.turn")

# Records [microphone, what the page plays] as 2 channels of one worklet, from the moment both
# exist, and the recorded length at which each reply event arrived (checked at every
# 128-sample chunk). The second channel is the output of the page's own playback graph
# (window.parley.playback, in the page's AudioContext): what the caller hears, including the
# page's cut of a paused reply.
START_RECORDER = """
async (REPLY_EVENTS) => {
  const rec = window.__v2v = {chunks: [], length: 0, rate: 0, started: false, events: [], lastSeq: 0};
  const processor = `registerProcessor("tap2", class extends AudioWorkletProcessor {
    process(inputs) {
      const a = inputs[0][0] || new Float32Array(128), b = inputs[1][0] || new Float32Array(128);
      this.port.postMessage([a.slice(), b.slice()]);
      return true;
    }
  });`;
  const timer = setInterval(async () => {
    const playback = window.parley.playback;
    const sender = window.parley.pc && window.parley.pc.getSenders().find((s) => s.track);
    if (!playback || !document.getElementById("remote").srcObject || !sender || rec.starting) return;
    rec.starting = true;
    clearInterval(timer);
    const context = playback.context;
    rec.rate = context.sampleRate;
    await context.audioWorklet.addModule(URL.createObjectURL(new Blob([processor], {type: "text/javascript"})));
    const tap = new AudioWorkletNode(context, "tap2", {numberOfInputs: 2, channelCount: 1, channelCountMode: "explicit"});
    context.createMediaStreamSource(new MediaStream([sender.track])).connect(tap, 0, 0);
    playback.output.connect(tap, 0, 1);
    const mute = context.createGain();
    mute.gain.value = 0;
    tap.connect(mute).connect(context.destination);
    tap.port.onmessage = (e) => {
      rec.chunks.push(e.data);
      rec.length += e.data[0].length;
      const events = window.parley.events, fresh = [];
      for (let i = events.length - 1; i >= 0 && events[i].seq > rec.lastSeq; i--) fresh.unshift(events[i]);
      for (const event of fresh) {
        if (REPLY_EVENTS.includes(event.type)) rec.events.push({...event, at: rec.length});
      }
      if (fresh.length) rec.lastSeq = fresh[fresh.length - 1].seq;
    };
    rec.started = true;
  }, 20);
}
"""
FETCH = """
() => {
  const rec = window.__v2v, n = rec.length, out = new Float32Array(2 * n);
  let at = 0;
  for (const [a, b] of rec.chunks) { out.set(a, at); out.set(b, n + at); at += a.length; }
  const bytes = new Uint8Array(out.buffer);
  let binary = "";
  for (let i = 0; i < bytes.length; i += 0x8000) binary += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  return btoa(binary);
}
"""


# The browser's receive jitter buffer (NetEq): mean delay of the samples it played out.
BROWSER_JITTER_DELAY = """
async () => {
  if (!window.parley.pc) return null;  // the call ended before the recording did
  const stats = await window.parley.pc.getStats();
  for (const report of stats.values()) {
    if (report.type === "inbound-rtp" && report.kind === "audio" && report.jitterBufferEmittedCount)
      return Math.round(1000 * report.jitterBufferDelay / report.jitterBufferEmittedCount * 10) / 10;
  }
  return null;
}
"""


def gateway_delays(values: dict[str, float]) -> dict[str, Optional[float]]:
    """Mean inbound jitter-buffer delay and the engine's recent STT lag p95, from /metrics samples."""
    count = values.get("parley_jitter_buffer_delay_ms_count")
    mean = values["parley_jitter_buffer_delay_ms_sum"] / count if count else None
    lag = values.get("parley_engine_stt_lag_p95_seconds")
    return {"gateway_jitter_buffer_ms_mean": round(mean, 1) if mean is not None else None,
            "engine_stt_lag_ms_p95": round(lag * 1000, 1) if lag is not None else None}


def barge_in_turns(turns: int, barge_ins: int) -> set[int]:
    """Which turns talk over the reply before them: every other one, from the second."""
    return set(list(range(1, turns, 2))[:barge_ins])


def caller_wav(speech_dir: Path, turns: int, barge_ins: int, lead_in_s: float, gap_s: float,
               barge_in_after_s: float, out: Path) -> float:
    """Write the caller's audio; returns its length in seconds."""
    clips = [resample(to_float(read_wav(p, 16000)), 16000, RATE) for p in sorted(speech_dir.glob("*.wav"))]
    if not clips:
        raise SystemExit(f"no .wav files in {speech_dir}")
    over = barge_in_turns(turns, barge_ins)
    parts = []
    for k in range(turns):
        pause_s = lead_in_s if k == 0 else barge_in_after_s if k in over else gap_s
        parts += [np.zeros(int(pause_s * RATE), np.float32), clips[k % len(clips)]]
    parts.append(np.zeros(int(gap_s * RATE), np.float32))
    signal = np.concatenate(parts)
    write_wav(out, signal, RATE)
    return len(signal) / RATE


def frame_dbfs(signal: np.ndarray, rate: int) -> np.ndarray:
    n = int(FRAME_S * rate)
    frames = signal[: len(signal) // n * n].reshape(-1, n)
    return 20 * np.log10(np.sqrt(np.mean(frames ** 2, axis=1)) + 1e-9)


def utterances(mic_db: np.ndarray) -> list[tuple[float, float]]:
    """(start, end) times (s) of the caller's stretches of speech (shorter pauses bridge)."""
    active = np.flatnonzero(mic_db > SPEECH_DBFS)
    if len(active) == 0:
        return []
    breaks = np.flatnonzero(np.diff(active) > MIN_PAUSE_S / FRAME_S)
    starts = [active[0], *active[breaks + 1]]
    ends = [*active[breaks], active[-1]]
    return [(a * FRAME_S, (b + 1) * FRAME_S) for a, b in zip(starts, ends)]


def reply_onsets(remote_db: np.ndarray, turn_ends: list[float]) -> list[Optional[float]]:
    """First loud frame after each turn end; None when Parley was already audible at the end."""
    onsets = []
    for k, end in enumerate(turn_ends):
        stop = turn_ends[k + 1] if k + 1 < len(turn_ends) else len(remote_db) * FRAME_S
        window = remote_db[int(end / FRAME_S): int(stop / FRAME_S)]
        loud = np.flatnonzero(window > ONSET_DBFS)
        onsets.append(end + loud[0] * FRAME_S if len(loud) and loud[0] > 0 else None)
    return onsets


@dataclass
class ReplyTimes:
    """When (s on the recording's clock) a reply's events arrived at the page."""

    start: float  # response.audio.start
    end: float = float("inf")  # response.audio.end or response.interrupted
    interrupted: Optional[float] = None
    paused: Optional[float] = None  # the first response.paused


def reply_times(events: list[dict], rate: int) -> list[ReplyTimes]:
    replies: dict[int, ReplyTimes] = {}
    for event in events:
        at = event["at"] / rate
        if event["type"] == "response.audio.start":
            replies.setdefault(event["turn"], ReplyTimes(at))
        elif event["type"] == "response.paused" and event["turn"] in replies:
            replies[event["turn"]].paused = replies[event["turn"]].paused or at
        elif event["type"] in ("response.audio.end", "response.interrupted") and event["turn"] in replies:
            replies[event["turn"]].end = min(replies[event["turn"]].end, at)
            if event["type"] == "response.interrupted":
                replies[event["turn"]].interrupted = at
    return sorted(replies.values(), key=lambda r: r.start)


@dataclass
class BargeIn:
    onset: float  # the caller started talking over the reply (s on the recording's clock)
    event_ms: Optional[float]  # onset -> response.interrupted arrived at the page; None: it never came
    stop_ms: Optional[float]  # onset -> end of Parley's last loud frame; None: not stopped
    pause_ms: Optional[float] = None  # onset -> response.paused arrived at the page


def barge_ins(remote_db: np.ndarray, onsets: list[float], replies: list[ReplyTimes]) -> list[BargeIn]:
    """The caller onsets that fell while a reply was playing, and whether (and when) it stopped."""
    loud = remote_db > ONSET_DBFS
    trials = []
    for onset in onsets:
        playing = next((r for r in replies if r.start <= onset < r.end), None)
        if playing is None or not loud[max(0, int((onset - TALKING_OVER_S) / FRAME_S)): int(onset / FRAME_S)].any():
            continue
        if playing.interrupted is None:
            trials.append(BargeIn(onset, None, None))
            continue
        pause_ms = (playing.paused - onset) * 1000 if playing.paused and playing.paused >= onset else None
        next_start = min((r.start for r in replies if r.start > playing.start), default=float("inf"))
        window_end = min(playing.interrupted + STOP_TAIL_S, next_start)
        heard = np.flatnonzero(loud[int(onset / FRAME_S): int(window_end / FRAME_S)])
        stop = onset + (heard[-1] + 1) * FRAME_S if len(heard) else onset
        trials.append(BargeIn(onset, (playing.interrupted - onset) * 1000, (stop - onset) * 1000, pause_ms))
    return trials


def percentile(values: list[float], q: float) -> Optional[float]:
    return round(float(np.percentile(values, q)), 1) if values else None


def flow_that_never_hangs_up(work: Path) -> Path:
    """The shipped contact-center flow without its end_call actions: a misheard "no" or
    "bye" would end the call, and with it every turn the bench still has to measure."""
    from gateway.responders.flow import DEFAULT_FLOW

    lines = DEFAULT_FLOW.read_text().splitlines()
    path = work / "flow.yaml"
    path.write_text("\n".join(line for line in lines if line.strip() != "action: end_call") + "\n")
    return path


async def record_call(args: argparse.Namespace, wav: Path, seconds: float) -> tuple[np.ndarray, int, list[dict]]:
    """Run the gateway and the browser; returns ([mic, remote] samples, their rate, reply events)."""
    from playwright.async_api import async_playwright

    flags = ["--mode", "conversation", "--port", str(free_port()), "--engine-threads", "1"]
    if args.stt_weights:
        flags += ["--stt-weights", args.stt_weights]
    if args.tts_weights:
        flags += ["--tts-weights", args.tts_weights]
    if args.responder:
        flags += ["--responder", args.responder]
    if args.responder in ("", "scripted"):
        flags += ["--flow-file", str(flow_that_never_hangs_up(wav.parent))]
    proc, url = await start_server(*flags)
    try:
        import aiohttp

        async with aiohttp.ClientSession() as http:
            await wait_ready(http, url)
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                                       args=chromium_args(wav))
            page = await browser.new_page()
            page.set_default_timeout(60_000)
            await page.goto(f"{url}/?processing=off")
            await page.evaluate(START_RECORDER, list(REPLY_EVENTS))
            await page.click("#call")
            await page.wait_for_function("window.__v2v.started")
            print(f"recording about {seconds:.0f} s", file=sys.stderr)
            await page.wait_for_function(f"window.__v2v.length >= window.__v2v.rate * {seconds}",
                                         timeout=(seconds + 120) * 1000, polling=500)
            rate = await page.evaluate("window.__v2v.rate")
            raw = np.frombuffer(base64.b64decode(await page.evaluate(FETCH)), dtype="<f4")
            events = await page.evaluate("window.__v2v.events")
            delays = {"browser_jitter_buffer_ms_mean": await page.evaluate(BROWSER_JITTER_DELAY),
                      "call_state_at_end": await page.evaluate("window.parley.state"),
                      "call_end_events": await page.evaluate(
                          "window.parley.events.filter(e => ['session.ended', 'error', 'session.migrate']"
                          ".includes(e.type))")}
            async with aiohttp.ClientSession() as http:
                delays.update(gateway_delays(await scrape(http, url)))
                async with http.get(f"{url}/debug/timing?seconds=60") as response:
                    timing = await response.json()
                # Late outbound frames make the browser's jitter buffer hold more (NetEq adapts to them).
                delays["pacing_lateness_ms_last_60s"] = timing["pacing_lateness_ms"]
                delays["event_loop_lag_ms_last_60s"] = timing["loop_lag_ms"]
            await browser.close()
    finally:
        await kill(proc)
    return raw.reshape(2, -1), rate, events, delays


async def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="parley-v2v-"))
    wav = work / "caller.wav"
    seconds = caller_wav(Path(args.speech), args.turns, args.barge_ins, args.lead_in_s, args.gap_s,
                         args.barge_in_after_s, wav)
    (mic, remote), rate, events, delays = await record_call(args, wav, seconds + 4.0)
    mic_db, remote_db = frame_dbfs(mic, rate), frame_dbfs(remote, rate)
    spoken = utterances(mic_db)
    ends = [end for _, end in spoken]
    onsets = reply_onsets(remote_db, ends)
    v2v = [(onset - end) * 1000 for end, onset in zip(ends, onsets) if onset is not None]
    trials = barge_ins(remote_db, [start for start, _ in spoken], reply_times(events, rate))
    stops = [t.stop_ms for t in trials if t.stop_ms is not None]
    heard_by_parley = [t.event_ms for t in trials if t.event_ms is not None]
    paused = [t.pause_ms for t in trials if t.pause_ms is not None]
    turns = [e for e in events if e["type"] == "metrics.turn"]
    return {
        "benchmark": "voice_to_voice",
        "v2v_ms_p50": round(statistics.median(v2v), 1) if v2v else None,
        "v2v_ms_p95": percentile(v2v, 95),
        "turns": len(v2v),
        "v2v_ms": [round(x, 1) for x in v2v],
        "turns_sent": args.turns,
        "caller_turns_found": len(spoken),
        "bargein_stop_ms_p50": round(statistics.median(stops), 1) if stops else None,
        "bargein_stop_ms_p95": percentile(stops, 95),
        "bargein_stop_ms": [round(x, 1) for x in stops],
        "bargein_event_ms_p50": round(statistics.median(heard_by_parley), 1) if heard_by_parley else None,
        "bargein_event_ms": [round(x, 1) for x in heard_by_parley],
        "bargein_pause_event_ms_p50": round(statistics.median(paused), 1) if paused else None,
        "bargein_pause_event_ms": [round(x, 1) for x in paused],
        "bargein_scheduled": len(barge_in_turns(args.turns, args.barge_ins)),
        "bargein_trials": len(trials),
        "bargein_stopped": len(stops),
        "bargein_not_stopped": len(trials) - len(stops),
        "stages_ms_p50": {s: (round(statistics.median([t[s] for t in turns if t.get(s) is not None]), 1)
                              if any(t.get(s) is not None for t in turns) else None) for s in STAGES},
        "interruptions": sum(e["type"] == "response.interrupted" for e in events),
        "path_delays": delays,
        "settings": {k: v for k, v in vars(args).items() if k != "json"},
        "definitions": {
            "v2v_ms": "end of the caller's utterance (mic channel) -> first 10 ms of Parley's audio above "
                      f"{ONSET_DBFS} dBFS (remote channel), one WebAudio clock in the browser",
            "bargein_stop_ms": f"the caller's onset (mic channel, above {SPEECH_DBFS} dBFS) while a reply plays "
                               f"-> the end of Parley's last 10 ms frame above {ONSET_DBFS} dBFS before it "
                               "stopped (remote channel), same clock; trials = onsets while a reply was "
                               f"playing and audible in the {TALKING_OVER_S * 1000:.0f} ms before; stopped = "
                               "its response.interrupted arrived",
            "bargein_event_ms": "the caller's onset -> response.interrupted arriving at the page (stopped trials, "
                                "in the order of bargein_stop_ms)",
            "path_delays": "where audio waits: the browser's receive jitter buffer (mean over the call), "
                           "the gateway's (mean), the engine's audio-pushed -> frame-recognized lag (recent p95), "
                           "how late the pacer sent its frames and the event loop's lag (last 60 s of the call)",
            "bargein_pause_event_ms": "the caller's onset -> response.paused arriving at the page (the reply "
                                      "was silenced from the frame after the gateway sent it)",
            "stages_ms_p50": "medians of the gateway's metrics.turn events (server clock; browser_playout_ms: "
                             "first frame sent -> the page's playout.started report arriving)",
        },
    }


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--barge-ins", type=int, default=10, help="turns that talk over the reply before them")
    parser.add_argument("--speech", default=str(Path(__file__).resolve().parent / "data" / "caller-turns"),
                        help="folder of caller turns (NAME.wav); tests/data/speech: the flite pair of earlier runs")
    parser.add_argument("--stt-weights", default="", help="STT .safetensors or training checkpoint (default: shipped)")
    parser.add_argument("--tts-weights", default="", help="TTS .safetensors or training checkpoint (default: shipped)")
    parser.add_argument("--responder", default="", help="default: the gateway's (scripted)")
    parser.add_argument("--lead-in-s", type=float, default=12.0, help="silence first, while the greeting plays")
    parser.add_argument("--gap-s", type=float, default=10.0,
                        help="silence before each other turn (for the reply), and at the end")
    parser.add_argument("--barge-in-after-s", type=float, default=2.0,
                        help="a barge-in turn starts this long after the turn before it ends")
    parser.add_argument("--json", action="store_true", help="print one JSON object (the default output)")
    args = parser.parse_args(argv)
    print(json.dumps(asyncio.run(run(args)), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Voice-to-voice latency: from the end of a caller's words to the first sound of Parley's
reply, heard at the browser.

How it runs
-----------
1. Builds a caller WAV: a lead-in (the greeting plays meanwhile), then --turns utterances of
   held-out voices (from --speech DIR: NAME.wav files; default tests/data/speech), each
   followed by --gap-s of silence for the reply.
2. Starts a real gateway process in conversation mode (the scripted responder by default,
   the shipped STT model, the TTS weights given by --tts-weights or the shipped ones) on a
   free loopback port.
3. Headless Chromium (Debian chromium via Playwright) calls it from the demo page with the
   WAV as its fake microphone. One AudioWorklet records, sample-aligned on one WebAudio
   clock, two channels: the page's own microphone track (what the caller says) and the
   remote audio element (what Parley says).
4. Offline: the caller's turn ends are found in channel 0 (the end of each utterance's
   energy), Parley's reply onsets in channel 1 (the first 10 ms frame above
   ONSET_DBFS after a turn end, before the next turn). v2v = onset - turn end. A turn
   whose end finds Parley still talking (the reply before it not finished, so the caller
   talked over it) has no clean onset and is not counted: keep --gap-s longer than the
   replies.

Output: one JSON object with v2v_ms_p50, v2v_ms_p95, turns (replies measured), turns_sent,
the per-stage medians of the gateway's metrics.turn events, and bargein_stop_ms_p50 (null:
not measured by this version). Progress on stderr.
Usage: python bench/voice_to_voice.py --turns 20 --tts-weights runs/tts/ckpt.pt --json
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from engine.audio import to_float  # noqa: E402
from engine.wavfile import read_wav  # noqa: E402
from tests.conftest import free_port  # noqa: E402
from tests.processes import kill, start_server, wait_ready  # noqa: E402
from tests.signals import resample, write_wav  # noqa: E402
from tests.test_browser import CHROMIUM, chromium_args  # noqa: E402

RATE = 48000
FRAME_S = 0.01  # analysis frames
SPEECH_DBFS = -40.0  # caller energy above this is speech
ONSET_DBFS = -45.0  # Parley's audio above this is a reply
STAGES = ("end_of_turn_ms", "responder_first_token_ms", "tts_first_audio_ms", "first_frame_ms", "total_ms")

# Records [microphone, remote] as 2 channels of one worklet, from the moment both exist.
START_RECORDER = """
async () => {
  const rec = window.__v2v = {chunks: [], length: 0, rate: 0, started: false};
  const context = new AudioContext();
  await context.resume();
  rec.rate = context.sampleRate;
  const processor = `registerProcessor("tap2", class extends AudioWorkletProcessor {
    process(inputs) {
      const a = inputs[0][0] || new Float32Array(128), b = inputs[1][0] || new Float32Array(128);
      this.port.postMessage([a.slice(), b.slice()]);
      return true;
    }
  });`;
  await context.audioWorklet.addModule(URL.createObjectURL(new Blob([processor], {type: "text/javascript"})));
  const timer = setInterval(() => {
    const remote = document.getElementById("remote").srcObject;
    const sender = window.parley.pc && window.parley.pc.getSenders().find((s) => s.track);
    if (!remote || !sender) return;
    clearInterval(timer);
    const tap = new AudioWorkletNode(context, "tap2", {numberOfInputs: 2, channelCount: 1, channelCountMode: "explicit"});
    context.createMediaStreamSource(new MediaStream([sender.track])).connect(tap, 0, 0);
    context.createMediaStreamSource(remote).connect(tap, 0, 1);
    const mute = context.createGain();
    mute.gain.value = 0;
    tap.connect(mute).connect(context.destination);
    tap.port.onmessage = (e) => { rec.chunks.push(e.data); rec.length += e.data[0].length; };
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


def caller_wav(speech_dir: Path, turns: int, lead_in_s: float, gap_s: float, out: Path) -> list[float]:
    """Write the caller's audio; returns the end time (s into the file) of each utterance."""
    clips = [resample(to_float(read_wav(p, 16000)), 16000, RATE) for p in sorted(speech_dir.glob("*.wav"))]
    if not clips:
        raise SystemExit(f"no .wav files in {speech_dir}")
    parts, ends, t = [np.zeros(int(lead_in_s * RATE), np.float32)], [], lead_in_s
    for k in range(turns):
        clip = clips[k % len(clips)]
        parts += [clip, np.zeros(int(gap_s * RATE), np.float32)]
        t += len(clip) / RATE
        ends.append(t)
        t += gap_s
    write_wav(out, np.concatenate(parts), RATE)
    return ends


def frame_dbfs(signal: np.ndarray, rate: int) -> np.ndarray:
    n = int(FRAME_S * rate)
    frames = signal[: len(signal) // n * n].reshape(-1, n)
    return 20 * np.log10(np.sqrt(np.mean(frames ** 2, axis=1)) + 1e-9)


def speech_ends(mic_db: np.ndarray, min_gap_frames: int = 50) -> list[float]:
    """End times (s) of the stretches of caller speech (gaps shorter than 0.5 s bridge)."""
    active = np.flatnonzero(mic_db > SPEECH_DBFS)
    if len(active) == 0:
        return []
    ends = [active[i] for i in range(len(active) - 1) if active[i + 1] - active[i] > min_gap_frames]
    return [(f + 1) * FRAME_S for f in [*ends, active[-1]]]


def reply_onsets(remote_db: np.ndarray, turn_ends: list[float]) -> list[Optional[float]]:
    """First loud frame after each turn end; None when Parley was already audible at the end."""
    onsets = []
    for k, end in enumerate(turn_ends):
        stop = turn_ends[k + 1] if k + 1 < len(turn_ends) else len(remote_db) * FRAME_S
        window = remote_db[int(end / FRAME_S): int(stop / FRAME_S)]
        loud = np.flatnonzero(window > ONSET_DBFS)
        onsets.append(end + loud[0] * FRAME_S if len(loud) and loud[0] > 0 else None)
    return onsets


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from playwright.async_api import async_playwright

    work = Path(tempfile.mkdtemp(prefix="parley-v2v-"))
    wav = work / "caller.wav"
    caller_wav(Path(args.speech), args.turns, args.lead_in_s, args.gap_s, wav)
    flags = ["--mode", "conversation", "--port", str(free_port()), "--engine-threads", "1"]
    if args.tts_weights:
        flags += ["--tts-weights", args.tts_weights]
    if args.responder:
        flags += ["--responder", args.responder]
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
            await page.evaluate(START_RECORDER)
            await page.click("#call")
            await page.wait_for_function("window.__v2v.started")
            total_s = args.lead_in_s + args.turns * (args.gap_s + 4.0) + 2.0
            print(f"recording about {total_s:.0f} s", file=sys.stderr)
            await page.wait_for_function(f"window.__v2v.length >= window.__v2v.rate * {total_s}",
                                         timeout=(total_s + 120) * 1000, polling=500)
            rate = await page.evaluate("window.__v2v.rate")
            raw = np.frombuffer(base64.b64decode(await page.evaluate(FETCH)), dtype="<f4")
            events = await page.evaluate("window.parley.events")
            await browser.close()
    finally:
        await kill(proc)
    mic, remote = raw.reshape(2, -1)
    ends = speech_ends(frame_dbfs(mic, rate))
    onsets = reply_onsets(frame_dbfs(remote, rate), ends)
    v2v = [(onset - end) * 1000 for end, onset in zip(ends, onsets) if onset is not None]
    turns = [e for e in events if e["type"] == "metrics.turn"]
    return {
        "benchmark": "voice_to_voice",
        "v2v_ms_p50": round(statistics.median(v2v), 1) if v2v else None,
        "v2v_ms_p95": round(float(np.percentile(v2v, 95)), 1) if v2v else None,
        "turns": len(v2v),
        "v2v_ms": [round(x, 1) for x in v2v],
        "turns_sent": args.turns,
        "caller_turn_ends_found": len(ends),
        "bargein_stop_ms_p50": None,
        "stages_ms_p50": {s: (round(statistics.median([t[s] for t in turns if t.get(s) is not None]), 1)
                              if any(t.get(s) is not None for t in turns) else None) for s in STAGES},
        "interruptions": sum(e["type"] == "response.interrupted" for e in events),
        "settings": {k: v for k, v in vars(args).items() if k != "json"},
        "definitions": {
            "v2v_ms": "end of the caller's utterance (mic channel) -> first 10 ms of Parley's audio above "
                      f"{ONSET_DBFS} dBFS (remote channel), one WebAudio clock in the browser",
            "stages_ms_p50": "medians of the gateway's metrics.turn events (server clock)",
        },
    }


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--speech", default=str(Path(__file__).resolve().parent.parent / "tests" / "data" / "speech"))
    parser.add_argument("--tts-weights", default="", help="TTS .safetensors or training checkpoint (default: shipped)")
    parser.add_argument("--responder", default="", help="default: the gateway's (scripted)")
    parser.add_argument("--lead-in-s", type=float, default=12.0, help="silence first, while the greeting plays")
    parser.add_argument("--gap-s", type=float, default=10.0, help="silence after each caller turn")
    parser.add_argument("--json", action="store_true", help="print one JSON object (the default output)")
    args = parser.parse_args(argv)
    print(json.dumps(asyncio.run(run(args)), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The echo suppressor's cost per 20 ms frame, on the event loop, on three kinds of line.

Every inbound frame of a conversation call goes through gateway/echo_suppressor.py on the
event loop, so its cost per frame, times 50 frames a second, times the calls up, is loop CPU.
While Parley speaks the cost depends on the line:

    echo           the caller's device plays Parley back (a speakerphone, a phone): -10 dB
                   after 150 ms, over microphone noise; the delay is found and tracked
    no_echo_noise  a browser whose own canceller removed the echo: microphone noise only,
                   so no delay is ever found, and the suppressor keeps searching
    no_echo_quiet  the same with digital silence (a muted microphone; the soak's callers)
    silent_parley  the anchor: Parley not speaking, the suppressor passing audio through

Each is run for --frames frames, --repeats times, on one thread. Output: one JSON object, per
line kind the microseconds per frame (CPU time of this thread), the median and the fastest of
the repeats, and whether a delay was found. Usage: python bench/echo_suppressor.py --json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gateway.echo_suppressor import FRAME, EchoSuppressor  # noqa: E402

ECHO_GAIN = 0.3  # about -10 dB
ECHO_DELAY = 150 * 16  # samples at 16 kHz
NOISE_RMS = 100.0  # int16: a quiet room through a laptop microphone (about -50 dBFS)
VOICE_RMS = 3000.0


def scene(kind: str, frames: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(reference, inbound), int16, `frames` frames each."""
    n = frames * FRAME
    reference = rng.normal(0, VOICE_RMS, n) if kind != "silent_parley" else np.zeros(n)
    inbound = np.zeros(n)
    if kind == "echo":
        inbound[ECHO_DELAY:] = ECHO_GAIN * reference[:n - ECHO_DELAY]
    if kind in ("echo", "no_echo_noise", "silent_parley"):
        inbound += rng.normal(0, NOISE_RMS, n)
    return (np.clip(reference, -32768, 32767).astype(np.int16), np.clip(inbound, -32768, 32767).astype(np.int16))


def cost_us(reference: np.ndarray, inbound: np.ndarray) -> tuple[float, bool]:
    suppressor = EchoSuppressor()
    started = time.thread_time()
    for start in range(0, len(inbound), FRAME):
        suppressor.add_reference(reference[start:start + FRAME])
        suppressor.process(inbound[start:start + FRAME])
    return (time.thread_time() - started) / (len(inbound) // FRAME) * 1e6, suppressor.delay is not None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=500, help="frames per run (500: 10 s of a reply)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", action="store_true", help="(the output is always JSON)")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    result = {}
    for kind in ("echo", "no_echo_noise", "no_echo_quiet", "silent_parley"):
        reference, inbound = scene(kind, args.frames, rng)
        runs = [cost_us(reference, inbound) for _ in range(args.repeats)]
        costs = [us for us, _ in runs]
        result[kind] = {"us_per_frame_median": round(float(np.median(costs)), 1),
                        "us_per_frame_min": round(min(costs), 1), "delay_found": runs[0][1]}
    result["settings"] = {"frames": args.frames, "repeats": args.repeats, "noise_rms": NOISE_RMS,
                          "echo_gain": ECHO_GAIN, "echo_delay_ms": ECHO_DELAY // 16}
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

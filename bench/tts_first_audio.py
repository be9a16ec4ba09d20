"""Time to first audio through the engine's runtime: the path the gateway's replies take.

    python -m bench.tts_first_audio --texts bench/tts_heldout.txt --rounds 2 --json

`python -m engine.bench tts` times the single-stream Synthesizer, the reference the runtime is
tested against. Here each line is a reply opened on a running SpeechEngine (tick thread, render
threads) as the gateway opens one: its words pushed at once as a responder streams them, then
end(). Time to first audio runs from the first push to the first Audio event on the caller's
asyncio loop, so it includes the tick's wake-up, phonemizing, the encoder, one render and the
hand-over back. The reply is then cancelled (its rest would play out at real time) and the
next one follows 50 ms later: one reply at a time, on an otherwise idle engine.

Output: one JSON object with ttfa_ms_p50, ttfa_ms_p95, n, torch_threads.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from engine.interface import Audio
from engine.runtime import SpeechEngine

PAUSE_BETWEEN_S = 0.05


async def first_audio_times(engine: SpeechEngine, lines: list[str], rounds: int) -> list[float]:
    times = []
    for round_ in range(rounds):
        for k, line in enumerate(lines):
            stream = engine.open_tts(f"reply-{round_}-{k}")
            started = time.perf_counter()
            for word in line.split(" "):
                stream.push_text(word + " ")
            stream.end()
            async for event in stream.events():
                if isinstance(event, Audio):
                    times.append(time.perf_counter() - started)
                    break
            stream.cancel()
            await asyncio.sleep(PAUSE_BETWEEN_S)
    return times


async def run(args: argparse.Namespace) -> dict:
    if args.threads:
        torch.set_num_threads(args.threads)
    lines = [line.strip() for line in Path(args.texts).read_text(encoding="utf-8").splitlines() if line.strip()]
    engine = SpeechEngine(with_tts=True)
    await asyncio.to_thread(engine.start)
    try:
        times = await first_audio_times(engine, lines[: args.limit or None], args.rounds)
    finally:
        engine.close()
    return {"benchmark": "tts_first_audio", "path": "engine runtime (SpeechEngine.open_tts)", "texts": args.texts,
            "n": len(times), "ttfa_ms_p50": round(float(np.median(times)) * 1000, 1),
            "ttfa_ms_p95": round(float(np.percentile(times, 95)) * 1000, 1), "torch_threads": torch.get_num_threads()}


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tts_first_audio", description=__doc__.split("\n")[0])
    parser.add_argument("--texts", default="bench/tts_heldout.txt")
    parser.add_argument("--rounds", type=int, default=2, help="times through the texts")
    parser.add_argument("--limit", type=int, default=0, help="first N lines only")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default, as the gateway)")
    parser.add_argument("--json", action="store_true", help="print one JSON object (the default output)")
    print(json.dumps(asyncio.run(run(parser.parse_args(argv)))))
    return 0


if __name__ == "__main__":
    sys.exit(main())

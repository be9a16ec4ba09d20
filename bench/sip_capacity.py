"""SIP capacity: N concurrent SIPp callers speak a recorded question in G.711 RTP to a real
gateway (conversation mode, Whisper tiny.en and the shipped TTS), press a key, hold, unhold
and hang up. Prints calls held, jitter-buffer delay p50/p95 (each call sampled while every
call is up) and reply latency p50 (metrics.turn total: the caller's last word -> Parley's
first reply frame sent).

    python bench/sip_capacity.py --calls 20 --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine import SpeechEngine  # noqa: E402
from gateway.app import SIP_KEY, WARMUP_KEY, create_app  # noqa: E402
from gateway.config import Config  # noqa: E402
from tests.kit.sipp import CALLER_WAV, SipEvents, dtmf_capture, free_udp_port, run_sipp, scenario, ulaw_file  # noqa: E402

TALK_MS = 12000  # each caller stays this long before its key, so replies happen with every call up


def percentile(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 1) if values else None


async def measure(calls: int, device: str, threads: int) -> dict:
    engine = SpeechEngine("whisper-tiny.en", with_tts=True, max_streams=calls + 2, device=device,
                          num_threads=threads or None)
    config = Config(mode="conversation", responder="echo", sip_port=free_udp_port(), max_sessions=calls + 4,
                    sip_max_calls=calls + 4, engine_max_streams=calls + 2).validate()
    app = create_app(config, speech_engine=engine)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    await app[WARMUP_KEY].done.wait()
    agent = app[SIP_KEY]
    events = SipEvents(agent)
    registry = app[SIP_KEY].registry
    delays: list[float] = []

    async def sample() -> None:
        await events.wait(lambda: len(events.all("session.ready")) == calls, timeout=300)
        await events.wait(lambda: len(events.all("metrics.turn")) >= 1, timeout=300)
        delays.extend(call.playout.buffer.stats.current_delay_ms for call in registry.calls.values())

    try:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp)
            path = scenario("caller", out, audio=ulaw_file(CALLER_WAV, out / "caller.ulaw"), talk_ms=TALK_MS,
                            dtmf_pcap=dtmf_capture("5"), after_ms=1000)
            sampler = asyncio.create_task(sample())
            status, output = await run_sipp(path, agent.port, calls=calls, rate=calls)
            await asyncio.wait_for(sampler, 60)
    finally:
        await runner.cleanup()
    latencies = [e["total_ms"] for e in events.all("metrics.turn") if e.get("total_ms") is not None]
    ended = [e["reason"] for e in events.all("session.ended")]
    return {"calls": calls, "calls_answered": len(events.all("session.ready")),
            "calls_held": sum(1 for reason in ended if reason == "hangup"), "sipp_exit_status": status,
            "jitter_delay_ms_p50": percentile(delays, 50), "jitter_delay_ms_p95": percentile(delays, 95),
            "reply_latency_ms_p50": percentile(latencies, 50), "replies": len(latencies),
            "dtmf_keys": len(events.all("dtmf")), "device": device}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    result = asyncio.run(measure(args.calls, args.device, args.threads))
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:24} {value}")


if __name__ == "__main__":
    main()

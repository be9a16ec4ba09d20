"""Impairment benchmark: a conversation-mode call over a real impaired network path, per
netem profile (clean, 5 % loss, 40 ms jitter with reordering, 200 ms loss bursts).

How it runs
-----------
tests/kit/netem.py puts the gateway (`python -m gateway serve --mode conversation
--responder echo`) in a network namespace of its own, joined to this process's namespace by
a veth pair with tc netem on both ends (needs root and a kernel with sch_netem). Where that
is impossible (the output's `path` says why), or with --relay, the gateway runs here and each
call crosses tests/kit/impair.py's UDP relay instead, which applies the same profiles per
datagram in user space (its own loss, delay and burst models rather than the kernel's). For each profile, one light aiortc
caller (tests.kit.peer.Caller) says real recordings (`--data`, ../shared/speech/real-dev;
`--clips` of them, or all with `--all`) one after another, each followed by silence, and
hears the agent's reply ("You said: …") to each.

    jitter-buffer delay   the gateway's call.stats (current_delay_ms, once a second): p50 and
                          p95 per third of the call, and the last third's p95 minus the
                          first's (growth)
    concealed fraction    samples the jitter buffer made by FEC, PLC or comfort silence,
                          over all samples it played (call.stats at the end)
    STT WER               transcript.final text against the recordings' .txt, normalised by
                          engine.wer; the same clips on the clean path are the baseline
    reply continuity      at the caller, over each reply (response.audio.start -> end): RTP
                          packets received / expected from the sequence numbers, and the
                          longest gap between arrivals

Output: one JSON object on stdout (`--json`); progress on stderr.
Usage: python bench/impairment.py --clips 6 --json   (as root for netem; else the relay)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Optional

import aiohttp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from engine.wer import normalize_for_wer, word_error_rate  # noqa: E402
from gateway.ice import use_host_addresses  # noqa: E402
from tests.kit.impair import ImpairedRelay  # noqa: E402
from tests.kit.netem import PROFILES, ImpairedPath, unavailable  # noqa: E402
from tests.kit.peer import Caller, encode_opus  # noqa: E402
from tests.kit.processes import kill, start_server, wait_ready  # noqa: E402
from tests.kit.talk import silence, utterance  # noqa: E402

DEFAULT_DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "speech" / "real-dev"
GAP_AFTER_S = 7.0  # silence after each clip: the turn ends and the echo reply plays
STEP_TIMEOUT_S = 90.0
FRAME_S = 0.02


def percentile(values: list[float], q: float) -> Optional[float]:
    return round(float(np.percentile(values, q)), 1) if values else None


def clips(data: Path, count: Optional[int]) -> list[tuple[np.ndarray, str]]:
    wavs = sorted(data.glob("*.wav"))[:count] if count else sorted(data.glob("*.wav"))
    return [(utterance(wav), wav.with_suffix(".txt").read_text().strip()) for wav in wavs]


def continuity(arrivals: list[tuple[int, float]], start: float, end: float) -> tuple[int, int, float]:
    """(received, expected, longest gap in ms) of the packets that arrived in [start, end]."""
    inside = [(seq, t) for seq, t in arrivals if start <= t <= end]
    if len(inside) < 2:
        return len(inside), len(inside), 0.0
    seqs = [seq for seq, _ in inside]
    expected = (max(seqs) - min(seqs)) % 65536 + 1
    gaps = [b - a for (_, a), (_, b) in zip(inside, inside[1:])]
    return len(set(seqs)), expected, max(gaps) * 1000


async def run_profile(http: aiohttp.ClientSession, url: str, path: Optional[ImpairedPath], profile: str,
                      talk: list[tuple[np.ndarray, str]]) -> dict[str, Any]:
    """One call under `profile`: over the netem `path`, or (None) through a relay of its own."""
    relay = None
    if path is not None:
        path.apply(profile)
    else:
        relay = await ImpairedRelay(profile, seed=len(talk)).start()
    parts = [silence(1.0)]
    for samples, _ in talk:
        parts += [samples, silence(GAP_AFTER_S)]
    caller = Caller(url, light=True, packets=encode_opus(np.concatenate(parts)),
                    offer_filter=relay.rewrite_offer if relay is not None else None,
                    answer_filter=relay.rewrite_answer if relay is not None else None)
    try:
        return await measure_call(http, caller, profile, talk)
    finally:
        if relay is not None:
            relay.close()


async def measure_call(http: aiohttp.ClientSession, caller: Caller, profile: str,
                       talk: list[tuple[np.ndarray, str]]) -> dict[str, Any]:
    await caller.call(http)
    assert caller.counter is not None
    caller.counter.record_arrivals = True
    started = time.monotonic()
    finals: list[str] = []
    replies: list[tuple[int, int, float]] = []
    try:
        for _ in talk:
            after = max(caller.seqs(), default=0)
            final = await caller.wait_for_event("transcript.final", STEP_TIMEOUT_S, where=lambda e: e["seq"] > after)
            finals.append(final["text"])
            start = await caller.wait_for_event("response.audio.start", STEP_TIMEOUT_S,
                                                where=lambda e: e["seq"] > final["seq"])
            started_at = time.monotonic()
            await caller.wait_for_event("response.audio.end", STEP_TIMEOUT_S,
                                        where=lambda e: e.get("turn") == start["turn"])
            replies.append(continuity(caller.counter.arrivals, started_at, time.monotonic()))
        stats = [e for e in caller.events if e["type"] == "call.stats"]
    finally:
        await caller.hang_up(http)
    delays = [s["jitter"]["current_delay_ms"] for s in stats if s["jitter"]["packets_played"]]
    thirds = [delays[i * len(delays) // 3:(i + 1) * len(delays) // 3] for i in range(3)]
    last = stats[-1]["jitter"] if stats else {}
    played = last.get("frames_pulled", 0) * 320
    refs = [normalize_for_wer(text) for _, text in talk]
    hyps = [normalize_for_wer(text) for text in finals]
    received = sum(r for r, _, _ in replies)
    expected = sum(e for _, e, _ in replies)
    return {
        "netem": " ".join(PROFILES[profile]) or "none",
        "seconds": round(time.monotonic() - started, 1),
        "jitter_delay_ms_p50_by_third": [percentile(t, 50) for t in thirds],
        "jitter_delay_ms_p95_by_third": [percentile(t, 95) for t in thirds],
        "jitter_delay_p95_growth_ms": (round(percentile(thirds[2], 95) - percentile(thirds[0], 95), 1)
                                       if thirds[0] and thirds[2] else None),
        "concealed_fraction": round(last.get("concealed_samples", 0) / played, 4) if played else None,
        "packets_lost_reordered_late": [last.get("packets_lost"), last.get("packets_reordered"),
                                        last.get("packets_late")],
        "stt_wer": round(word_error_rate(refs, hyps), 4),
        "reply_packets_received_fraction": round(received / expected, 4) if expected else None,
        "reply_longest_gap_ms": round(max((g for _, _, g in replies), default=0.0), 1),
        "replies": len(replies),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    profiles = args.profiles.split(",")
    reason = "--relay" if args.relay else unavailable(netem=any(p != "clean" for p in profiles))
    talk = clips(args.data, None if args.all else args.clips)
    path = None if reason else ImpairedPath(os.getpid() % 200 + 20).open()
    how = ("tc netem on a veth pair between network namespaces" if path is not None else
           f"user-space UDP relay (tests/kit/impair.py), because: {reason}")
    gateway_ip = path.gateway_ip if path is not None else "127.0.0.1"
    use_host_addresses([path.caller_ip if path is not None else "127.0.0.1"])
    results: dict[str, Any] = {}
    proc = None
    try:
        proc, url = await start_server(
            "--host", gateway_ip, "--mode", "conversation", "--responder", "echo",
            "--stt-model", args.stt_model, "--engine-threads", "1", "--idle-prompt-s", "120",
            env={"PARLEY_ICE_ADDRESSES": gateway_ip, "PARLEY_LOG_LEVEL": "error"},
            prefix=tuple(path.command()) if path is not None else ())
        async with aiohttp.ClientSession() as http:
            await wait_ready(http, url)
            for profile in profiles:
                print(f"{profile}: {len(talk)} clips", file=sys.stderr)
                try:
                    results[profile] = await run_profile(http, url, path, profile, talk)
                except Exception as exc:  # a failed profile is a figure, not a crash
                    results[profile] = {"failed": f"{type(exc).__name__}: {str(exc)[:300]}"}
                print(json.dumps(results[profile]), file=sys.stderr)
    finally:
        if proc is not None:
            await kill(proc)
        if path is not None:
            path.close()
    clean_wer = results.get("clean", {}).get("stt_wer")
    return {
        "path": how,
        "profiles": results,
        "wer_vs_clean": {p: round(r["stt_wer"] - clean_wer, 4) for p, r in results.items()
                         if clean_wer is not None and "stt_wer" in r},
        "settings": {"clips": len(talk), "data": str(args.data), "stt_model": args.stt_model},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
    }


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path(os.environ.get("PARLEY_REAL_DEV", DEFAULT_DATA)))
    parser.add_argument("--clips", type=int, default=6, help="how many recordings (sorted by name)")
    parser.add_argument("--all", action="store_true", help="every recording in --data")
    parser.add_argument("--profiles", default=",".join(PROFILES))
    parser.add_argument("--stt-model", default="whisper-tiny.en", help="the node's recognizer")
    parser.add_argument("--relay", action="store_true", help="impair through the user-space relay even where netem works")
    parser.add_argument("--json", action="store_true", help="(the output is always JSON)")
    args = parser.parse_args(argv)
    result = asyncio.run(run(args))
    print(json.dumps(result, indent=2))
    return 0 if all("failed" not in r for r in result["profiles"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())

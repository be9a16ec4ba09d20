"""Reconnect benchmark: a caller drops and resumes its session, many times, on one node or
across two nodes sharing Redis.

How it runs
-----------
Starts a throwaway redis-server and two gateways (`python -m gateway serve --redis-url …`,
echo-test mode) on free loopback ports. One light aiortc caller (tests.kit.peer.Caller) calls
node A. Then, `--cycles` times:

1. The caller sends a marker (a client message the gateway answers with a logged `error`
   event), waits for that event, and then pretends it never arrived: the resume reports the
   `last_seq` from before it, so the gateway must replay it.
2. The connection drops: the caller closes its peer connection (same-node cycles, the
   gateway notices), or simply goes silent and resumes on the other node, which takes the
   session over from the live node (cross-node cycles; every other cycle).
3. A new peer connection sends POST /v1/calls {resume_token, last_seq}; the clock runs from
   creating the new offer to the first RTP packet of resumed audio from the gateway.

Turns stand in as markers until the conversation loop lands: a marker is *lost* if it is
not replayed after the resume, *duplicated* if the caller receives any event seq twice.

Output: one JSON object on stdout (success_rate, resume_ms_p50, resume_ms_p95, lost_turns,
duplicated_turns, cycles, plus the same-node and cross-node split); progress on stderr.
Usage: python bench/reconnect.py --cycles 100
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Optional

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gateway.ice import use_host_addresses  # noqa: E402
from tests.kit.ports import free_port  # noqa: E402
from tests.kit.peer import QUIET, Caller  # noqa: E402
from tests.kit.processes import kill, start_server, wait_ready  # noqa: E402
from tests.kit.redis_server import RedisServer  # noqa: E402

SECRET = "bench-reconnect-secret"
STEP_TIMEOUT_S = 30.0


def percentile(values: list[float], q: float) -> Optional[float]:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))], 1)


async def start_node(redis_url: str, node_id: str) -> tuple[asyncio.subprocess.Process, str]:
    port = free_port()
    env = {"PARLEY_REDIS_URL": redis_url, "PARLEY_SECRET": SECRET, "PARLEY_NODE_ID": node_id,
           "PARLEY_PUBLIC_URL": f"http://127.0.0.1:{port}", "PARLEY_LOG_LEVEL": "error"}
    return await start_server("--port", str(port), env=env)


class Session:
    """What the caller knows: its token, and every event seq it has received."""

    def __init__(self) -> None:
        self.token: Optional[str] = None
        self.seen: list[int] = []
        self.markers: list[int] = []  # seqs of marker events, as first received

    def absorb(self, caller: Caller, up_to: Optional[int] = None) -> None:
        """Count `caller`'s events as seen; with `up_to`, only those the client claims to have."""
        self.seen += [e["seq"] for e in caller.events if up_to is None or e["seq"] <= up_to]


async def wait_marker(caller: Caller, count_before: int) -> dict:
    deadline = time.monotonic() + STEP_TIMEOUT_S
    while True:
        errors = [e for e in caller.events if e["type"] == "error"]
        if len(errors) > count_before:
            return errors[-1]
        if time.monotonic() > deadline:
            raise TimeoutError("marker event never arrived")
        caller.event_arrived.clear()
        try:
            await asyncio.wait_for(caller.event_arrived.wait(), 1.0)
        except asyncio.TimeoutError:
            pass


async def cycle(http: aiohttp.ClientSession, caller: Caller, session: Session, url: str,
                same_node: bool) -> tuple[Caller, dict[str, Any]]:
    """One drop-and-resume; returns the new caller and this cycle's figures."""
    errors_before = len([e for e in caller.events if e["type"] == "error"])
    before_marker = max(e["seq"] for e in caller.events)
    caller.channel.send("marker: not JSON")
    marker = await wait_marker(caller, errors_before)
    session.markers.append(marker["seq"])
    session.absorb(caller, up_to=before_marker)  # the rest is "lost" with the connection
    if same_node:
        await caller.close()
    else:
        caller.track.stop()  # gone quiet; the old node is still alive and must hand over
    started = time.monotonic()
    resumed = Caller(url, light=True, packets=QUIET)
    await resumed.call(http, resume_token=session.token, last_seq=before_marker)
    await asyncio.wait_for(resumed.counter.first_packet.wait(), STEP_TIMEOUT_S)
    resume_ms = (resumed.counter.first_packet_at - started) * 1000
    await asyncio.wait_for(resumed.wait_for_event("session.ready"), STEP_TIMEOUT_S)
    session.token = resumed.response["resume_token"]
    replayed = [e for e in resumed.events if e["seq"] <= before_marker or e["seq"] == marker["seq"]]
    if not same_node:
        await caller.close()
    return resumed, {"resume_ms": resume_ms, "marker_replayed": any(e["seq"] == marker["seq"] for e in replayed),
                     "replayed_below_last_seq": sum(e["seq"] <= before_marker for e in resumed.events)}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    use_host_addresses(["127.0.0.1"])
    redis = RedisServer()
    (proc_a, url_a), (proc_b, url_b) = await asyncio.gather(start_node(redis.url, "node-a"),
                                                            start_node(redis.url, "node-b"))
    rows: list[dict[str, Any]] = []
    failures: list[str] = []
    duplicated = 0
    try:
        async with aiohttp.ClientSession() as http:
            await asyncio.gather(wait_ready(http, url_a), wait_ready(http, url_b))
            session = Session()
            caller = Caller(url_a, light=True, packets=QUIET)
            await caller.call(http)
            await caller.wait_for_event("session.ready", STEP_TIMEOUT_S)
            session.token = caller.response["resume_token"]
            here = url_a
            for i in range(args.cycles):
                same_node = i % 2 == 0
                target = here if same_node else (url_b if here == url_a else url_a)
                try:
                    caller, row = await cycle(http, caller, session, target, same_node)
                    here = target
                    row["kind"] = "same_node" if same_node else "cross_node"
                    rows.append(row)
                except Exception as exc:  # a failed cycle is a figure, not a crash
                    failures.append(f"cycle {i}: {type(exc).__name__}: {exc}")
                    print(failures[-1], file=sys.stderr)
                    break
                if (i + 1) % 10 == 0:
                    print(f"{i + 1} cycles", file=sys.stderr)
            session.absorb(caller)
            await caller.close()
    finally:
        await kill(proc_a)
        await kill(proc_b)
        redis.stop()
    # Each caller's events are absorbed once, so a seq seen twice arrived twice.
    duplicated = len(session.seen) - len(set(session.seen))
    lost = sum(not row["marker_replayed"] for row in rows) + (args.cycles - len(rows))
    resume = [row["resume_ms"] for row in rows]
    split = {kind: [row["resume_ms"] for row in rows if row["kind"] == kind] for kind in ("same_node", "cross_node")}
    return {
        "cycles": args.cycles,
        "success_rate": round(len(rows) / args.cycles, 4),
        "resume_ms_p50": percentile(resume, 50),
        "resume_ms_p95": percentile(resume, 95),
        "same_node_resume_ms_p50": percentile(split["same_node"], 50),
        "same_node_resume_ms_p95": percentile(split["same_node"], 95),
        "cross_node_resume_ms_p50": percentile(split["cross_node"], 50),
        "cross_node_resume_ms_p95": percentile(split["cross_node"], 95),
        "lost_turns": lost,
        "duplicated_turns": duplicated,
        "replayed_events_already_seen": sum(row["replayed_below_last_seq"] for row in rows),
        "failures": failures,
        "machine": {"cpus": __import__("os").cpu_count(), "python": platform.python_version()},
        "definitions": {
            "resume_ms": "new RTCPeerConnection's offer created -> first RTP packet from the gateway",
            "lost_turns": "marker events (stand-ins for turns) not replayed after the resume, plus cycles not completed",
            "duplicated_turns": "event seqs the caller received more than once over the whole run",
            "cross_node": "resume on the other node while the old node still drives the session (takeover)",
        },
    }


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=100)
    args = parser.parse_args(argv)
    result = asyncio.run(run(args))
    print(json.dumps(result, indent=2))
    return 0 if result["success_rate"] == 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())

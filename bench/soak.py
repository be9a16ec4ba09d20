"""Soak benchmark: conversation-mode calls around the clock on one gateway process, each
caller talking, hearing the reply, hanging up and redialling, while the process's RSS, open
file descriptors, event-loop stalls and asyncio tasks are watched.

How it runs
-----------
Starts `python -m gateway serve --mode conversation --responder echo` on a free loopback
port. `--calls` light aiortc callers (tests.kit.peer.Caller, light=True: pre-encoded Opus,
received packets counted, not decoded) each loop until `--minutes` have passed: call, say
an utterance (recorded speech, tests/data/speech), wait for the turn to end and the reply
("You said: …") to finish playing, hang up (DELETE), redial. A 503 (engine admission
control) is counted and retried after Retry-After.

Every `--sample-s` seconds the process is read: RSS and open fds from /proc/<pid>, the
live asyncio tasks (parley_event_loop_tasks) from /metrics, the longest event-loop stall
since the last sample from GET /debug/timing, and the machine's 1-minute load average.

    rss_growth_pct, fd_growth_pct  median of the first three samples after the first
                                   minute against the median of the last three. The node
                                   keeps a hung-up caller's session (its history, for
                                   resuming) --session-ttl-s, 120 s here against 3600 s
                                   served: kept sessions are what it was told to keep,
                                   not growth. engine_rss_growth_pct: the same for the
                                   engine's process (--engine-process; null with the
                                   engine inside the node)
    task_leak                      tasks with no call up after the run, minus before it.
                                   Both counts are taken with no idle HTTP connection of
                                   the soak's own open (the callers' client session is
                                   closed first, and the counting requests use
                                   Connection: close): aiohttp keeps one task per open
                                   keep-alive connection, which is no call's leftover
    fds_idle_before, _after        open fds with no call up, before the first call and
                                   after the last: a descriptor leak shows here, where
                                   fd_growth_pct also moves with the calls up at a sample
    loop_stall_ms_max              the longest 10 ms timer lateness from the first call
                                   on; loop_stalls_over_50ms counts them (/metrics
                                   histogram, less its count before the first call)
    loop_busy_stalls_over_50ms     those of them the loop's own thread spent mostly on a
                                   CPU (the loop's own code, stretched or not by waiting
                                   for a core)
    loop_cpu_wait_stalls_over_50ms those it spent mostly on a run queue (more runnable
                                   threads than cores: the node's own and the callers',
                                   which share this machine; see load_1m)
    loop_steal_stalls_over_50ms    those it lost mostly to the virtual machine's host (steal
                                   on the loop thread's CPU, /proc/stat; see
                                   cpu_pct.machine_steal); the rest are the thread asleep,
                                   waiting for the GIL or a lock
    gc_full_passes, gc_pause_ms_max  the cyclic collector's full passes from the first call
                                   on, and its longest pass of any generation
    gc_pauses_over_50ms            collector passes longer than a loop stall (each holds
                                   the GIL: the loop waits them out)
    cpu_pct                        CPU used while calls were up, in % of one core: the node's
                                   process (node), its main thread, which runs the event
                                   loop (node_loop), its engine process (engine_process:
                                   0 with the engine in the node's own process), and this
                                   process's callers (callers), which share the machine's
                                   cores with the node; machine_steal is the % of all CPU
                                   time the virtual machine's host took (/proc/stat steal):
                                   the loop cannot run then (a stall it makes counts as
                                   steal)
    startup_loop_stall_ms_max      the same before the first call (the engine loading and
                                   warming up in worker threads, /readyz 503 meanwhile;
                                   the last minute of it), reported apart: no call is up
                                   then; startup_loop_stalls_over_50ms counts them

Output: one JSON object on stdout (`--json`; a summary line per sample on stderr). A failed
call names the step it waited for and its connection's state; `kill -USR1` the soak to print
where each of its tasks waits; `--server-log FILE` keeps the node's log.
Usage: python bench/soak.py --minutes 30 --calls 8 --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Optional

import aiohttp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from engine import DEFAULT_STT_MODEL, STT_MODELS  # noqa: E402
from gateway.ice import use_host_addresses  # noqa: E402
from tests.kit.memory import rss_mib  # noqa: E402
from tests.kit.metrics import scrape  # noqa: E402
from tests.kit.peer import Caller, encode_opus  # noqa: E402
from tests.kit.processes import kill, start_server, wait_ready  # noqa: E402
from tests.kit.talk import UTTERANCES, silence, utterance  # noqa: E402

STEP_TIMEOUT_S = 90.0  # one turn with every caller talking at once, on a busy machine
IDLE_SETTLE_S = 30.0  # after the last hang-up, for the call tasks to finish
WARM_UP_S = 60.0  # samples before this are not the baseline (caches, first calls)
STALL_MS = 50.0
SPEECH_EVERY_S = 12.0  # a light caller loops its audio: one utterance per this period


def proc_figures(pid: int) -> dict[str, float]:
    """The node's RSS and open fds, and its engine process's RSS (0 with the engine inside)."""
    with open(f"/proc/{pid}/task/{pid}/children") as children:
        engine = round(sum(rss_mib(child) for child in children.read().split()), 1)
    return {"rss_mib": round(rss_mib(pid), 1), "engine_rss_mib": engine, "fds": len(os.listdir(f"/proc/{pid}/fd"))}


def cpu_seconds(pid: int) -> dict[str, float]:
    """CPU seconds so far: the node's process, its main (event-loop) thread, its engine
    process (engine_process, a child of the node), and this process."""
    def from_stat(path: str) -> float:
        with open(path) as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime

    with open(f"/proc/{pid}/task/{pid}/children") as children:
        engine = sum(from_stat(f"/proc/{child}/stat") for child in children.read().split())
    own = os.times()
    return {"node": from_stat(f"/proc/{pid}/stat"), "node_loop": from_stat(f"/proc/{pid}/task/{pid}/stat"),
            "engine_process": engine, "callers": own.user + own.system}


def cpu_pct(start: dict[str, float], end: dict[str, float], seconds: float) -> dict[str, float]:
    return {name: round(100 * (end[name] - start[name]) / seconds, 1) for name in start}


def machine_ticks() -> tuple[int, int]:
    """(all, stolen) CPU ticks of the machine so far (/proc/stat): a virtual machine's steal is
    time its host ran something else on our CPUs."""
    with open("/proc/stat") as stat:
        fields = [int(value) for value in stat.readline().split()[1:9]]
    return sum(fields), fields[7]


class Tally:
    def __init__(self) -> None:
        self.calls = self.turns = self.refused = 0
        self.failures: list[str] = []


async def one_call(http: aiohttp.ClientSession, url: str, packets: list[bytes], tally: Tally) -> None:
    caller = Caller(url, light=True, packets=packets)
    step = "call"
    try:
        try:
            await caller.call(http)
        except RuntimeError as exc:
            if " 503 " in str(exc) or " 429 " in str(exc):
                tally.refused += 1
                await asyncio.sleep(2.0)
                return
            raise
        tally.calls += 1
        step = "turn.end"
        end = await caller.wait_for_event("turn.end", STEP_TIMEOUT_S)
        step = "response.audio.start"
        start = await caller.wait_for_event("response.audio.start", STEP_TIMEOUT_S,
                                            where=lambda e: e["seq"] > end["seq"])
        step = "response.audio.end"
        await caller.wait_for_event("response.audio.end", STEP_TIMEOUT_S,
                                    where=lambda e: e.get("turn") == start["turn"])
        tally.turns += 1
    except Exception as exc:  # a failed call is a figure, not a crash
        tally.failures.append(f"{time.strftime('%H:%M:%S')} waiting for {step} "
                              f"(connection {caller.pc.connectionState}): {type(exc).__name__}; "
                              f"events {event_trail(caller.events)}")
    finally:
        await caller.hang_up(http)


def event_trail(events: list[dict], last: int = 16) -> str:
    """The call's last events, with their turn numbers, less the periodic call.stats: what
    the reply did before the wait ran out."""
    trail = [event["type"] + (f":{event['turn']}" if "turn" in event else "")
             for event in events if event["type"] != "call.stats"]
    return ("... " if len(trail) > last else "") + " ".join(trail[-last:])


async def caller_loop(http: aiohttp.ClientSession, url: str, packets: list[bytes], deadline: float,
                      tally: Tally) -> None:
    while time.monotonic() < deadline:
        await one_call(http, url, packets, tally)


def dump_tasks() -> None:
    for task in asyncio.all_tasks():
        print(f"task {task.get_name()}:", file=sys.stderr)
        awaited = task.get_coro()
        while awaited is not None:  # down the chain of awaits to where it waits
            frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
            if frame is not None:
                print(f"  {frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}", file=sys.stderr)
            awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
            if awaited is not None and not hasattr(awaited, "cr_frame") and not hasattr(awaited, "gi_frame"):
                print(f"  awaits {awaited!r:.200}", file=sys.stderr)
                break


def load_1m() -> float:
    with open("/proc/loadavg") as loadavg:
        return float(loadavg.read().split()[0])


async def loop_stall_max(http: aiohttp.ClientSession, url: str, window_s: float) -> float:
    async with http.get(url + "/debug/timing", params={"seconds": str(window_s)}) as response:
        timing = await response.json()
    return timing["loop_lag_ms"].get("max", 0.0)


async def sample(http: aiohttp.ClientSession, url: str, pid: int, window_s: float) -> dict[str, Any]:
    metrics = await scrape(http, url)
    return {**proc_figures(pid), "tasks": metrics.get("parley_event_loop_tasks", 0.0),
            "live_calls": metrics.get("parley_active_sessions", 0.0),
            "loop_stall_ms_max": await loop_stall_max(http, url, window_s), "load_1m": load_1m()}


async def idle_tasks(http: aiohttp.ClientSession, url: str) -> float:
    """The task count once no call is up (after the sampler has refreshed it). `http` should
    close its connections after each request (see task_leak above)."""
    deadline = time.monotonic() + IDLE_SETTLE_S
    while True:
        metrics = await scrape(http, url)
        if metrics.get("parley_active_sessions", 0.0) == 0 or time.monotonic() > deadline:
            await asyncio.sleep(3.0)  # the sampler sets the gauge once a second
            return (await scrape(http, url)).get("parley_event_loop_tasks", 0.0)
        await asyncio.sleep(0.5)


def growth_pct(samples: list[dict[str, Any]], key: str) -> Optional[float]:
    warm = [s for s in samples if s["t_s"] >= min(WARM_UP_S, samples[-1]["t_s"] / 3)]
    if len(warm) < 2:
        return None
    first = statistics.median(s[key] for s in warm[:3])
    last = statistics.median(s[key] for s in warm[-3:])
    return round(100 * (last - first) / first, 2)


def collector_figures(startup: dict[str, float], final: dict[str, float]) -> dict[str, float]:
    """The collector's passes between two scrapes (parley_gc_pause_seconds, gateway/heap.py)."""
    def since(name: str) -> float:
        return final.get(name, 0.0) - startup.get(name, 0.0)

    passes = [since(f"parley_gc_pause_seconds_count{{generation={g}}}") for g in range(3)]
    long = [since(f"parley_gc_pause_seconds_count{{generation={g}}}")
            - since(f"parley_gc_pause_seconds_bucket{{generation={g},le={STALL_MS / 1000}}}") for g in range(3)]
    return {"gc_full_passes": passes[2], "gc_passes_all": sum(passes), "gc_pauses_over_50ms": sum(long),
            "gc_pause_ms_max": round(1000 * max(final.get(f"parley_gc_pause_longest_seconds{{generation={g}}}", 0.0)
                                                for g in range(3)), 2)}


def stalls_over(metrics: dict[str, float], threshold_ms: float) -> float:
    total = metrics.get("parley_event_loop_lag_seconds_count", 0.0)
    under = metrics.get(f"parley_event_loop_lag_seconds_bucket{{le={threshold_ms / 1000}}}", total)
    return total - under


async def run(args: argparse.Namespace) -> dict[str, Any]:
    use_host_addresses(["127.0.0.1"])
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, dump_tasks)  # kill -USR1: where is it waiting?
    clips = [utterance(name) for name in UTTERANCES]
    proc, url = await start_server("--mode", "conversation", "--responder", "echo", "--stt-model", args.stt_model,
                                   "--engine-threads", "1", "--idle-prompt-s", "60",
                                   "--resume-token-ttl-s", str(args.session_ttl_s),
                                   "--engine-process", "true" if args.engine_process else "false",
                                   env={"PARLEY_LOG_LEVEL": args.server_log_level},
                                   log_path=args.server_log)
    tally = Tally()
    samples: list[dict[str, Any]] = []
    try:
        # The soak's own requests close their connection; the callers share a session of their own.
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:
            await wait_ready(http, url)
            tasks_before = await idle_tasks(http, url)
            fds_before = proc_figures(proc.pid)["fds"]
            startup = await scrape(http, url)  # start-up: everything before the first call
            startup_stall_max = await loop_stall_max(http, url, 60.0)
            calls_http = aiohttp.ClientSession()
            started = time.monotonic()
            cpu_start, ticks_start = cpu_seconds(proc.pid), machine_ticks()
            deadline = started + args.minutes * 60
            # Callers start a little apart, each with its own utterance and phase.
            loops = []
            for i in range(args.calls):
                lead = silence(0.5 + 0.7 * i)
                speech = clips[i % len(clips)]
                rest = silence(max(1.0, SPEECH_EVERY_S - len(lead) / 48000 - len(speech) / 48000))
                packets = encode_opus(np.concatenate([lead, speech, rest]))
                loops.append(asyncio.ensure_future(caller_loop(calls_http, url, packets, deadline, tally)))
            while time.monotonic() < deadline:
                await asyncio.sleep(min(args.sample_s, max(0.0, deadline - time.monotonic())))
                # The first window must not reach back into start-up (reported apart).
                row = await sample(http, url, proc.pid, min(args.sample_s, time.monotonic() - started))
                row["t_s"] = round(time.monotonic() - started, 1)
                samples.append(row)
                print(f"{row['t_s']:.0f} s: {row['live_calls']:.0f} calls, RSS {row['rss_mib']} MiB, "
                      f"{row['fds']} fds, {row['tasks']:.0f} tasks, stall max {row['loop_stall_ms_max']} ms, "
                      f"{tally.turns} turns, {len(tally.failures)} failures", file=sys.stderr)
            cpu = cpu_pct(cpu_start, cpu_seconds(proc.pid), time.monotonic() - started)
            ticks_end = machine_ticks()
            cpu["machine_steal"] = round(100 * (ticks_end[1] - ticks_start[1]) / max(1, ticks_end[0] - ticks_start[0]), 1)
            await asyncio.gather(*loops)
            await calls_http.close()  # its keep-alive connections end, and their tasks on the node
            tasks_after = await idle_tasks(http, url)
            final = await scrape(http, url)
            fds_after = proc_figures(proc.pid)["fds"]
    finally:
        await kill(proc)
    stall_max = max((s["loop_stall_ms_max"] for s in samples), default=0.0)
    return {
        "minutes": args.minutes, "concurrent_calls": args.calls,
        "calls_placed": tally.calls, "turns_completed": tally.turns, "refused_503_429": tally.refused,
        "failed_calls": len(tally.failures), "failures": tally.failures[:10],
        "rss_growth_pct": growth_pct(samples, "rss_mib"), "fd_growth_pct": growth_pct(samples, "fds"),
        "engine_rss_growth_pct": (growth_pct(samples, "engine_rss_mib")
                                  if samples and samples[0]["engine_rss_mib"] else None),
        "rss_mib_first_last": [samples[0]["rss_mib"], samples[-1]["rss_mib"]] if samples else None,
        "loop_stall_ms_max": stall_max,
        "loop_stalls_over_50ms": stalls_over(final, STALL_MS) - stalls_over(startup, STALL_MS),
        "loop_busy_stalls_over_50ms": (final.get("parley_event_loop_busy_stalls_total", 0.0)
                                       - startup.get("parley_event_loop_busy_stalls_total", 0.0)),
        "loop_cpu_wait_stalls_over_50ms": (final.get("parley_event_loop_cpu_wait_stalls_total", 0.0)
                                           - startup.get("parley_event_loop_cpu_wait_stalls_total", 0.0)),
        "loop_steal_stalls_over_50ms": (final.get("parley_event_loop_steal_stalls_total", 0.0)
                                        - startup.get("parley_event_loop_steal_stalls_total", 0.0)),
        **collector_figures(startup, final),
        "cpu_pct": cpu,
        "startup_loop_stall_ms_max": startup_stall_max,
        "startup_loop_stalls_over_50ms": stalls_over(startup, STALL_MS),
        "load_1m_first_last": [samples[0]["load_1m"], samples[-1]["load_1m"]] if samples else None,
        "tasks_idle_before": tasks_before, "tasks_idle_after": tasks_after,
        "task_leak": tasks_after - tasks_before, "fds_idle_before": fds_before, "fds_idle_after": fds_after,
        "samples": samples,
        "settings": {"stt_model": args.stt_model, "responder": "echo", "sample_s": args.sample_s,
                     "engine_process": args.engine_process,
                     "session_ttl_s": args.session_ttl_s},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
    }


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--calls", type=int, default=8, help="concurrent conversation-mode callers")
    parser.add_argument("--sample-s", type=float, default=15.0)
    parser.add_argument("--stt-model", default=DEFAULT_STT_MODEL, choices=STT_MODELS,
                        help=f"the node's recognizer (default {DEFAULT_STT_MODEL}, as the node serves)")
    parser.add_argument("--session-ttl-s", type=int, default=120,
                        help="how long the node keeps a hung-up caller's session for resuming (its "
                             "resume_token_ttl_s; served default 3600): what a node is told to keep is not "
                             "growth, so the soak keeps it short")
    parser.add_argument("--engine-process", action=argparse.BooleanOptionalAction, default=True,
                        help="the node's engine in a child process (its engine_process setting, the served "
                             "default); --no-engine-process: inside the node")
    parser.add_argument("--server-log", help="write the node's log (stderr) to this file")
    parser.add_argument("--server-log-level", default="error", help="the node's PARLEY_LOG_LEVEL")
    parser.add_argument("--client-log-level", default="warning", help="the callers' log level (aiortc, aioice), on stderr")
    parser.add_argument("--json", action="store_true", help="(the output is always JSON)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.client_log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    result = asyncio.run(run(args))
    print(json.dumps(result, indent=2))
    ok = (result["failed_calls"] == 0 and result["task_leak"] <= 0 and result["loop_stall_ms_max"] <= STALL_MS
          and all(g is not None and g <= 5 for g in (result["rss_growth_pct"], result["fd_growth_pct"]))
          and (result["engine_rss_growth_pct"] or 0) <= 5)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Gateway capacity: how many concurrent echo-test calls one Parley process carries on time.

Over 400 lines, kept as one script: the gateway process, the worker processes that host the
callers and the window arithmetic are read together to trust one figure, nothing else uses
them, and about 50 lines are this description of the method.

How it runs
-----------
1. Starts the gateway as its own process (`python -m gateway serve`, echo-test mode, call.stats
   every second, --ice-addresses 127.0.0.1) on a free loopback port and waits for /livez.
2. For each size N in --sizes, opens N concurrent real aiortc callers (tests.kit.peer.Caller) spread
   over --client-procs worker processes. Each caller sends a looped chirp signal with its own
   20 ms pacing and records what comes back. Once all N are connected (or have failed), a
   measurement window of --seconds starts, the same wall-clock window for every process.
3. After the window each worker reports, per call, the server's `call.stats` events emitted inside
   the window, whether audio came back, and its own event-loop lag; the main process reads the
   server's CPU time (utime + stime from /proc/<pid>/stat) at both ends of the window.
4. Hangs up, waits until the server has no calls left, and goes on to the next N. It stops after
   the first N whose pacing p99 exceeds --threshold-ms (10) or where a call failed or dropped,
   unless --no-stop.

What the figures mean (also written into the JSON's "definitions")
-------------------------------------------------------------------
- pacing lateness: how late the server's outbound pacer woke for each 20 ms frame (PacedAudioTrack).
  The server only publishes per-call rolling percentiles over its last 3000 frames (60 s), so the
  figures come from each call's last call.stats event in the window: pacing_lateness_ms_p50 is the
  median across calls of the per-call p50; pacing_lateness_ms_p99 is the MAX across calls of the
  per-call p99 (pacing_lateness_ms_p99_median is the median). With --seconds < 60 the per-call
  window also covers the call's connect phase, which biases the tail upwards.
- jb_delay_ms_p50: median of jitter.current_delay_ms over every call.stats event of every call in
  the window (inbound jitter-buffer delay); jb_mean_wait_ms: median across calls of mean_wait_ms.
- server_cpu_pct: 100 * server CPU seconds / window seconds; cpu_pct_per_session divides that by the
  number of connected calls.
- server_loop_lag_ms_p99: the server's own event-loop lag, read from call.stats' `loop` field or
  GET /debug/timing when the gateway has them (null otherwise; pacing lateness is then the proxy).
- client_loop_lag_ms_p99: the BENCHMARK CLIENTS' event-loop lag (how late a 10 ms sleep wakes in
  each worker), pooled over workers; not the server's. High client lag means the clients, not
  the server, are the bottleneck.
- If the gateway serves GET /debug/timing?seconds=S (raw pacer lateness pooled over live calls and
  loop lag over the last S seconds), pacing and loop-lag figures come from it instead, exactly
  over the window; "pacing_source" says which.

The clients (aiortc in Python: Opus encode/decode and SRTP per call) share the machine's CPUs
with the server, so on a small machine they may saturate first; client_cpu_pct and
machine_cpu_busy_pct say how busy they and the machine were.

Output: one JSON object on stdout; progress on stderr; with --table a Markdown table on stderr.
Usage: python bench/gateway_capacity.py --sizes 1,8,16,32 --seconds 15 --table
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import aiohttp  # noqa: E402
import numpy as np  # noqa: E402

from gateway.ice import use_host_addresses  # noqa: E402
from tests.kit.peer import RATE, Caller, encode_opus  # noqa: E402
from tests.kit.signals import chirp_sequence  # noqa: E402

LOOPBACK = "127.0.0.1"
AUDIO_BACK_PEAK = 0.05  # a call "got audio back" if the echo peaks above this (chirps are 0.5)
LAG_PERIOD_S = 0.010  # the client loop-lag probe sleeps this long
CLK_TCK = os.sysconf("SC_CLK_TCK")

DEFINITIONS = {
    "pacing_source": "where the pacing figures come from: 'call.stats' (per-call rolling percentiles, "
                     "below) or 'debug/timing' (the gateway's raw per-frame lateness of the window's last "
                     "seconds, pooled over calls, when the gateway serves GET /debug/timing)",
    "pacing_lateness_ms_p50": "server outbound pacer lateness per 20 ms frame. call.stats: median across "
                              "calls of each call's lateness_ms_p50 from its last call.stats event in the "
                              "window (per call over its last <=3000 frames = 60 s, so with seconds < 60 it "
                              "includes the connect phase). debug/timing: p50 of the pooled raw samples",
    "pacing_lateness_ms_p99": "call.stats: MAX across calls of each call's lateness_ms_p99 (same source; "
                              "pacing_lateness_ms_p99_median is the median across calls). debug/timing: p99 "
                              "of the pooled raw samples (the call.stats pair is kept in "
                              "pacing_call_stats_ms_p50_p99)",
    "pacing_lateness_ms_max": "max across calls of lateness_ms_max (over each call's whole life)",
    "pacer_clock_resyncs": "sum across calls of pacer clock_resyncs (the server loop stalled > 0.5 s)",
    "jb_delay_ms_p50": "median of jitter.current_delay_ms over all call.stats events of all calls in the window",
    "jb_mean_wait_ms": "median across calls of jitter.mean_wait_ms (mean buffer wait of played packets)",
    "server_cpu_pct": "100 * server process CPU seconds (utime+stime) / window wall seconds",
    "cpu_pct_per_session": "server_cpu_pct / connected calls",
    "client_cpu_pct": "same as server_cpu_pct, summed over the benchmark's client worker processes",
    "machine_cpu_busy_pct": "whole machine busy time over the window (/proc/stat), all processes, "
                            "as a share of all CPUs",
    "server_loop_lag_ms_p99": "SERVER event-loop lag p99 (how late its timer probe wakes), when the "
                              "gateway publishes it: 'call.stats' = max across calls of loop.lag_ms_p99 in "
                              "the last in-window event (over the last minute); 'debug/timing' = over the "
                              "window; null when the gateway exposes neither",
    "client_loop_lag_ms_p99": "CLIENT side, not server: p99 over all worker processes of how late a "
                              "10 ms asyncio.sleep woke during the window",
    "connected": "calls connected when the window started",
    "calls_with_stats": "connected calls that received at least one call.stats event in the window; the "
                        "call.stats figures describe only these (a starved machine delays the data channel)",
    "failed": "calls that were refused or did not connect, plus calls that dropped during the window",
    "audio_back_fraction": f"share of connected calls whose returned audio peaked above {AUDIO_BACK_PEAK} "
                           "(the echo of the chirps) during the window",
    "max_sessions_within_10ms_p99": "largest N such that it and every smaller N measured had no failed "
                                    "call and pacing_lateness_ms_p99 <= threshold_ms; 0 if none",
}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- /proc readings ----------------------------------------------------------------------------

def process_cpu_seconds(pid: int) -> float:
    """utime + stime of a process, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # fields 14 and 15 of proc(5)


def machine_cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    total = sum(values[:8])  # guest time is already counted in user
    return total - idle, total


def percentile(values: list[float], q: float) -> Optional[float]:
    return round(float(np.percentile(values, q)), 2) if values else None


def median(values: list[float]) -> Optional[float]:
    return round(statistics.median(values), 2) if values else None


# -- the gateway process ---------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


class GatewayProcess:
    """`python -m gateway serve` on a free loopback port; its output goes to a temp file."""

    def __init__(self, max_sessions: int) -> None:
        self.port = free_port()
        self.url = f"http://{LOOPBACK}:{self.port}"
        self.output = tempfile.NamedTemporaryFile("w+", prefix="parley-bench-", suffix=".log")
        command = [sys.executable, "-m", "gateway", "serve", "--host", LOOPBACK, "--port", str(self.port),
                   "--mode", "echo-test", "--ice-addresses", LOOPBACK, "--stats-interval-s", "1",
                   "--max-sessions", str(max_sessions), "--log-level", "warning"]
        self.proc = subprocess.Popen(command, cwd=REPO, stdout=self.output, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def cpu_seconds(self) -> float:
        return process_cpu_seconds(self.pid)

    def get_json(self, path: str) -> tuple[int, dict]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=5) as response:
                return response.status, json.load(response)
        except urllib.error.HTTPError as exc:
            return exc.code, json.load(exc)

    def timing(self, seconds: float) -> Optional[dict]:
        """Raw server timing over the last `seconds` from GET /debug/timing, if this gateway has it."""
        try:
            status, body = self.get_json(f"/debug/timing?seconds={seconds:g}")
        except (OSError, ValueError):
            return None
        return body if status == 200 else None

    def wait_live(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited with {self.proc.returncode}:\n{self.output_tail()}")
            try:
                if self.get_json("/livez")[0] == 200:
                    return
            except (OSError, ValueError):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"gateway not live after {timeout} s:\n{self.output_tail()}")

    def wait_empty(self, timeout: float = 60.0) -> bool:
        """Wait until the gateway holds no calls (hang-ups are processed asynchronously)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                status, body = self.get_json("/readyz")
                if status == 200 and body.get("active_sessions") == 0:
                    return True
            except (OSError, ValueError):
                pass
            time.sleep(0.5)
        return False

    def output_tail(self, lines: int = 20) -> str:
        self.output.flush()
        self.output.seek(0)
        return "".join(self.output.readlines()[-lines:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.output.close()


# -- client worker process (one asyncio loop, N/k callers) ----------------------------------

class LoopLag:
    """Records how late a short asyncio.sleep wakes: (unix time, lag in ms)."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []

    async def run(self) -> None:
        while True:
            start = time.monotonic()
            await asyncio.sleep(LAG_PERIOD_S)
            self.samples.append((time.time(), (time.monotonic() - start - LAG_PERIOD_S) * 1000.0))

    def within(self, t0: float, t1: float) -> list[float]:
        return [lag for t, lag in self.samples if t0 <= t <= t1]


class Client:
    """A Caller plus what the benchmark tracks about it."""

    def __init__(self, url: str, samples: LoopedSignal, packets: Optional[list[bytes]]) -> None:
        light = packets is not None
        self.caller = Caller(url, samples, light=light, packets=packets)
        self.connected = False
        self.error: Optional[str] = None
        self.peak_in_window = 0.0
        self.loud_at_window_start: Optional[int] = None
        self.loud_in_window = 0

    async def connect(self, http: aiohttp.ClientSession, gate: asyncio.Semaphore, timeout: float) -> None:
        async with gate:  # limit concurrent handshakes (DTLS is CPU heavy)
            try:
                await self.caller.call(http)
                await self.caller.wait_connected(timeout)
                self.connected = True
            except Exception as exc:
                self.error = f"{type(exc).__name__}: {exc}"[:300]

    def drain_audio(self, in_window: bool) -> None:
        """Drop recorded audio (it would fill memory), keeping its peak while in the window."""
        counter = self.caller.counter
        if counter is not None:  # a light caller counts loud packets instead of decoding
            if in_window and self.loud_at_window_start is None:
                self.loud_at_window_start = counter.loud_packets
            if in_window:
                self.loud_in_window = counter.loud_packets - self.loud_at_window_start
            return
        chunks, self.caller.received = self.caller.received, []
        if in_window and chunks:
            self.peak_in_window = max(self.peak_in_window, float(np.abs(np.concatenate(chunks)).max()))

    def summary(self, t0: float, t1: float) -> dict[str, Any]:
        stats = [e for e in self.caller.events if e.get("type") == "call.stats" and t0 <= e["t"] <= t1]
        last = stats[-1] if stats else {}
        pacer, jitter = last.get("pacer", {}), last.get("jitter", {})
        return {
            "connected": self.connected,
            "dropped": self.connected and self.caller.pc.connectionState != "connected",
            "error": self.error,
            "stats_events": len(stats),
            "jb_delay_ms": [e["jitter"]["current_delay_ms"] for e in stats],
            "jb_mean_wait_ms": jitter.get("mean_wait_ms"),
            "lateness_ms_p50": pacer.get("lateness_ms_p50"),
            "lateness_ms_p99": pacer.get("lateness_ms_p99"),
            "lateness_ms_max": pacer.get("lateness_ms_max"),
            "clock_resyncs": pacer.get("clock_resyncs", 0),
            "server_loop_lag_ms_p99": last.get("loop", {}).get("lag_ms_p99"),
            "got_audio": self.peak_in_window > AUDIO_BACK_PEAK or self.loud_in_window > 0,
        }


class LoopedSignal:
    """`base` repeated for ever; SignalTrack only ever slices its samples frame by frame."""

    def __init__(self, base: np.ndarray) -> None:
        self.base = base

    def __getitem__(self, frame: slice) -> np.ndarray:
        return np.take(self.base, np.arange(frame.start, frame.stop), mode="wrap")


async def drain_audio_forever(clients: list[Client], window: dict) -> None:
    while True:
        await asyncio.sleep(0.5)
        now = time.time()
        in_window = bool(window) and window["t0"] <= now <= window["t1"] + 0.5
        for client in clients:
            client.drain_audio(in_window)


async def run_worker(conn, url: str, n: int, args: dict) -> None:
    use_host_addresses([LOOPBACK])  # media stays on loopback
    loop = asyncio.get_running_loop()
    lag = LoopLag()
    window: dict = {}
    signal = chirp_sequence(RATE)
    samples = LoopedSignal(signal)
    packets = None if args["full_clients"] else encode_opus(signal)
    clients = [Client(url, samples, packets) for _ in range(n)]
    background = [loop.create_task(lag.run()), loop.create_task(drain_audio_forever(clients, window))]
    async with aiohttp.ClientSession() as http:
        gate = asyncio.Semaphore(args["connect_concurrency"])
        await asyncio.gather(*(c.connect(http, gate, args["connect_timeout"]) for c in clients))
        conn.send(("connected", sum(c.connected for c in clients)))
        t0, t1 = await loop.run_in_executor(None, conn.recv)
        window.update(t0=t0, t1=t1)
        await asyncio.sleep(max(0.0, t1 - time.time()) + 1.0)  # + the last events in flight
        result = {"calls": [c.summary(t0, t1) for c in clients], "loop_lag_ms": lag.within(t0, t1)}
        await asyncio.gather(*(c.caller.hang_up(http) for c in clients if c.caller.response.get("location")),
                             return_exceptions=True)
        await asyncio.gather(*(c.caller.close() for c in clients), return_exceptions=True)
    for task in background:
        task.cancel()
    conn.send(("done", result))


def worker_main(conn, url: str, n: int, args: dict) -> None:
    try:
        asyncio.run(run_worker(conn, url, n, args))
    except BaseException:
        try:
            conn.send(("error", traceback.format_exc()))
        except OSError:
            pass  # the main process is gone
    finally:
        conn.close()


# -- one size N, measured from the main process ---------------------------------------------

class Workers:
    """k spawned client processes sharing N callers, talked to over pipes."""

    def __init__(self, url: str, n: int, procs: int, args: dict) -> None:
        k = max(1, min(procs, n))
        shares = [n // k + (1 if i < n % k else 0) for i in range(k)]
        context = multiprocessing.get_context("spawn")  # no forked asyncio or aiortc state
        self.pipes, self.procs = [], []
        for share in shares:
            parent, child = context.Pipe()
            proc = context.Process(target=worker_main, args=(child, url, share, args), daemon=True)
            proc.start()
            child.close()
            self.pipes.append(parent)
            self.procs.append(proc)

    def receive(self, kind: str, timeout: float) -> list[Any]:
        deadline = time.monotonic() + timeout
        out = []
        for pipe in self.pipes:
            if not pipe.poll(max(0.0, deadline - time.monotonic())):
                raise TimeoutError(f"a client worker sent no {kind!r} within {timeout:.0f} s")
            message = pipe.recv()
            if message[0] == "error":
                raise RuntimeError(f"client worker failed:\n{message[1]}")
            out.append(message[1])
        return out

    def send_all(self, message: Any) -> None:
        for pipe in self.pipes:
            pipe.send(message)

    def cpu_seconds(self) -> float:
        return sum(process_cpu_seconds(p.pid) for p in self.procs)

    def stop(self) -> None:
        for proc in self.procs:
            proc.join(10)
            if proc.is_alive():
                proc.terminate()
                proc.join(5)
        for pipe in self.pipes:
            pipe.close()


def measure(gateway: GatewayProcess, n: int, args: argparse.Namespace) -> dict[str, Any]:
    worker_args = {"seconds": args.seconds, "connect_timeout": args.connect_timeout,
                   "connect_concurrency": args.connect_concurrency, "full_clients": args.full_clients}
    workers = Workers(gateway.url, n, args.client_procs, worker_args)
    try:
        connect_budget = args.connect_timeout * math.ceil(n / args.connect_concurrency) + 120
        connected = sum(workers.receive("connected", connect_budget))
        log(f"N={n}: {connected}/{n} connected; measuring for {args.seconds:g} s")
        t0 = time.time()
        server0, clients0, machine0 = gateway.cpu_seconds(), workers.cpu_seconds(), machine_cpu_ticks()
        workers.send_all((t0, t0 + args.seconds))
        time.sleep(max(0.0, t0 + args.seconds - time.time()))
        wall = time.time() - t0
        server1, clients1, machine1 = gateway.cpu_seconds(), workers.cpu_seconds(), machine_cpu_ticks()
        timing = gateway.timing(args.seconds)
        results = workers.receive("done", 120)
    finally:
        workers.stop()
    busy = (machine1[0] - machine0[0]) / max(1, machine1[1] - machine0[1])
    row = summarize(n, results, (server1 - server0) / wall, (clients1 - clients0) / wall, busy)
    return apply_timing(row, timing) if timing else row


def summarize(n: int, results: list[dict], server_cpu: float, client_cpu: float, busy: float) -> dict[str, Any]:
    calls = [c for r in results for c in r["calls"]]
    live = [c for c in calls if c["connected"]]
    p50s = [c["lateness_ms_p50"] for c in live if c["lateness_ms_p50"] is not None]
    p99s = [c["lateness_ms_p99"] for c in live if c["lateness_ms_p99"] is not None]
    maxes = [c["lateness_ms_max"] for c in live if c["lateness_ms_max"] is not None]
    waits = [c["jb_mean_wait_ms"] for c in live if c["jb_mean_wait_ms"] is not None]
    delays = [d for c in live for d in c["jb_delay_ms"]]
    lags = [lag for r in results for lag in r["loop_lag_ms"]]
    server_lags = [c["server_loop_lag_ms_p99"] for c in live if c["server_loop_lag_ms_p99"] is not None]
    dropped = sum(c["dropped"] for c in live)
    errors = sorted({c["error"] for c in calls if c["error"]})
    row = {
        "n": n,
        "pacing_source": "call.stats",
        "pacing_lateness_ms_p50": median(p50s),
        "pacing_lateness_ms_p99": round(max(p99s), 2) if p99s else None,
        "pacing_lateness_ms_p99_median": median(p99s),
        "pacing_lateness_ms_max": round(max(maxes), 2) if maxes else None,
        "pacer_clock_resyncs": sum(c["clock_resyncs"] for c in live),
        "jb_delay_ms_p50": median(delays),
        "jb_mean_wait_ms": median(waits),
        "cpu_pct_per_session": round(100 * server_cpu / len(live), 2) if live else None,
        "server_cpu_pct": round(100 * server_cpu, 1),
        "client_cpu_pct": round(100 * client_cpu, 1),
        "machine_cpu_busy_pct": round(100 * busy, 1),
        "server_loop_lag_ms_p99": round(max(server_lags), 2) if server_lags else None,
        "server_loop_lag_source": "call.stats" if server_lags else None,
        "client_loop_lag_ms_p50": percentile(lags, 50),
        "client_loop_lag_ms_p99": percentile(lags, 99),
        "connected": len(live),
        "failed": len(calls) - len(live) + dropped,
        "dropped": dropped,
        "audio_back_fraction": round(sum(c["got_audio"] for c in live) / len(live), 3) if live else 0.0,
        "stats_events": sum(c["stats_events"] for c in live),
        "calls_with_stats": sum(1 for c in live if c["stats_events"]),
    }
    if errors:
        row["errors"] = errors[:5]
    return row


def apply_timing(row: dict, timing: dict) -> dict:
    """Prefer the server's raw figures over the window (GET /debug/timing) where it has them."""
    pacing, loop_lag = timing.get("pacing_lateness_ms", {}), timing.get("loop_lag_ms", {})
    if pacing.get("samples"):
        row["pacing_call_stats_ms_p50_p99"] = [row["pacing_lateness_ms_p50"], row["pacing_lateness_ms_p99"]]
        row.update(pacing_source="debug/timing", pacing_lateness_ms_p50=pacing["p50"],
                   pacing_lateness_ms_p99=pacing["p99"])
    if loop_lag.get("samples"):
        row.update(server_loop_lag_ms_p99=loop_lag["p99"], server_loop_lag_source="debug/timing")
    return row


def passes(row: dict, threshold_ms: float) -> bool:
    p99 = row["pacing_lateness_ms_p99"]
    return row["failed"] == 0 and row["connected"] == row["n"] and p99 is not None and p99 <= threshold_ms


# -- output ------------------------------------------------------------------------------

TABLE_COLUMNS = [
    ("N", "n"), ("connected", "connected"), ("failed", "failed"),
    ("pacing source", "pacing_source"), ("pacing p50 ms", "pacing_lateness_ms_p50"),
    ("pacing p99 ms", "pacing_lateness_ms_p99"), ("per-call pacing p99 ms, median", "pacing_lateness_ms_p99_median"),
    ("JB delay p50 ms", "jb_delay_ms_p50"), ("JB mean wait ms", "jb_mean_wait_ms"),
    ("server CPU %", "server_cpu_pct"), ("CPU %/session", "cpu_pct_per_session"),
    ("client CPU %", "client_cpu_pct"), ("machine busy %", "machine_cpu_busy_pct"),
    ("server loop lag p99 ms", "server_loop_lag_ms_p99"), ("client loop lag p99 ms", "client_loop_lag_ms_p99"),
    ("audio back", "audio_back_fraction"),
]


def markdown_table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(title for title, _ in TABLE_COLUMNS) + " |",
             "|" + "|".join("---:" for _ in TABLE_COLUMNS) + "|"]
    for row in rows:
        lines.append("| " + " | ".join("-" if row.get(key) is None else str(row[key])
                                       for _, key in TABLE_COLUMNS) + " |")
    return "\n".join(lines)


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1,8,16,32,64",
                        help="comma-separated call counts (default %(default)s)")
    parser.add_argument("--seconds", type=float, default=20.0,
                        help="measurement window per size (default %(default)s)")
    parser.add_argument("--client-procs", type=int, default=2,
                        help="client worker processes sharing the callers (default %(default)s)")
    parser.add_argument("--connect-concurrency", type=int, default=4,
                        help="concurrent call set-ups per worker (default %(default)s)")
    parser.add_argument("--connect-timeout", type=float, default=30.0, help="per call (default %(default)s s)")
    parser.add_argument("--threshold-ms", type=float, default=10.0, help="pacing p99 limit (default %(default)s)")
    parser.add_argument("--full-clients", action="store_true",
                        help="callers encode with aiortc and decode what comes back (default: light callers "
                             "send pre-encoded Opus and count returned packets, leaving the CPU to the gateway)")
    parser.add_argument("--no-stop", action="store_true", help="measure every size even after one fails")
    parser.add_argument("--table", action="store_true", help="also print a Markdown table to stderr")
    args = parser.parse_args(argv)
    args.sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    if not args.sizes or min(args.sizes) < 1 or args.client_procs < 1:
        parser.error("--sizes must be positive integers and --client-procs at least 1")
    return args


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    use_host_addresses([LOOPBACK])
    rows: list[dict] = []
    gateway = GatewayProcess(max_sessions=max(args.sizes) + 8)
    try:
        gateway.wait_live()
        log(f"gateway pid {gateway.pid} live at {gateway.url}")
        for n in args.sizes:
            row = measure(gateway, n, args)
            rows.append(row)
            log(f"N={n}: " + json.dumps({k: v for k, v in row.items() if k != "errors"}))
            if not gateway.wait_empty():
                log(f"warning: the gateway still holds calls after N={n}")
            if not passes(row, args.threshold_ms) and not args.no_stop:
                log(f"N={n} is over the limit (p99 > {args.threshold_ms:g} ms or failed calls): stopping")
                break
    finally:
        gateway.stop()
    within = 0
    for row in rows:
        if not passes(row, args.threshold_ms):
            break
        within = row["n"]
    report = {
        "benchmark": "gateway_capacity",
        "machine": {"cpu_count": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform(), "clients_share_machine": True,
                    "client_procs": args.client_procs,
                    "clients": "full (aiortc encode + decode)" if args.full_clients
                               else "light (pre-encoded Opus out, returned packets counted, not decoded)",
                    "note": "the aiortc clients run on the same CPUs as the gateway; see client_cpu_pct "
                            "and machine_cpu_busy_pct"},
        "seconds": args.seconds,
        "threshold_ms": args.threshold_ms,
        "rows": rows,
        "max_sessions_within_10ms_p99": within,
        "definitions": DEFINITIONS,
    }
    print(json.dumps(report, indent=2))
    if args.table:
        print(markdown_table(rows), file=sys.stderr)
        print("pacing p99: call.stats = max across calls of each call's p99 (rolling minute); "
              "debug/timing = p99 of all calls' raw frames in the window. See the JSON's definitions.",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

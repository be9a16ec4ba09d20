"""Prometheus metrics for GET /metrics, on a per-app registry (several apps may share a process).

Gauges read live state when scraped; per-call media figures (jitter-buffer delay,
concealment, pacing lateness) and event-loop lag are sampled once per
SAMPLE_INTERVAL_S by one task, never per frame on the media path.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from typing import TYPE_CHECKING, Iterable, Iterator, Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from . import heap
from .loop_monitor import PROBE_INTERVAL_S

if TYPE_CHECKING:
    from .call import Call
    from .loop_monitor import LoopLagMonitor

SAMPLE_INTERVAL_S = 1.0  # how often live calls and the loop monitor are sampled
SAMPLES_PER_S = 50  # 20 ms frames per second: bounds the pacer samples taken per call per tick
JITTER_DELAY_BUCKETS_MS = (10, 20, 40, 60, 80, 100, 150, 200, 300, 500, 1000)
LATENESS_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5)
LOOP_LAG_BUCKETS_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)
STALL_MS = 50.0  # a probe this late is a stall, counted by where the loop thread spent most of it: on a CPU
# (busy: the loop's own code, however long it then waited for a core), on a run queue (CPU wait: more
# runnable threads than cores), its virtual CPU taken by the host (steal), or none of these (asleep:
# waiting for the GIL that another thread holds, or a lock)
TURN_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0, 1.5, 2.0, 3.0, 5.0)
# metrics.turn stages; browser_playout arrives in a second metrics.turn, when the page reports it
TURN_STAGES = ("end_of_turn", "responder_first_token", "tts_first_audio", "first_frame", "total", "browser_playout")
CONTENT_TYPE = CONTENT_TYPE_LATEST


class Metrics:
    """The gateway's metrics; live calls and the loop lag come from the node's CallRegistry
    (gateway/registry.py), which owns this object: nothing here imports it back."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=self.registry)
        self.registry.register(CollectorPauseMetrics(heap.watch_collector()))
        r = self.registry
        self.active_sessions = Gauge("parley_active_sessions", "Live calls plus slots being set up", registry=r)
        self.draining = Gauge("parley_draining", "1 while the node drains after SIGTERM", registry=r)
        self.ready = Gauge("parley_ready", "1 once warm-up succeeded and the node is not draining", registry=r)
        self.calls = Counter("parley_calls", "Calls ended, by outcome (the call's close reason)",
                             ["outcome"], registry=r)
        self.http_requests = Counter("parley_http_requests", "HTTP requests by route template and status",
                                     ["route", "status"], registry=r)
        self.jitter_delay = Histogram("parley_jitter_buffer_delay_ms",
                                      "Jitter-buffer playout delay per live call, sampled each second",
                                      buckets=JITTER_DELAY_BUCKETS_MS, registry=r)
        self.concealed = Counter("parley_concealed_samples", "Inbound samples (16 kHz) produced by FEC, PLC "
                                 "or comfort silence", registry=r)
        self.lateness = Histogram("parley_pacing_lateness_seconds", "Outbound 20 ms frame send lateness",
                                  buckets=LATENESS_BUCKETS_S, registry=r)
        self.loop_lag = Histogram("parley_event_loop_lag_seconds", "How late a 10 ms event-loop timer wakes",
                                  buckets=LOOP_LAG_BUCKETS_S, registry=r)
        self.loop_busy_stalls = Counter("parley_event_loop_busy_stalls", "10 ms event-loop probes late by over "
                                        "50 ms that the loop's own thread spent mostly on a CPU (code blocking the loop); "
                                        "the rest spent mostly waiting for a CPU (cpu_wait_stalls), with their "
                                        "virtual CPU taken by its host (steal_stalls) or asleep (the GIL or a lock)",
                                        registry=r)
        self.loop_cpu_wait_stalls = Counter("parley_event_loop_cpu_wait_stalls", "10 ms event-loop probes late "
                                            "by over 50 ms that the loop's thread spent mostly runnable on a run "
                                            "queue (more runnable threads than cores)",
                                            registry=r)
        self.loop_steal_stalls = Counter("parley_event_loop_steal_stalls", "10 ms event-loop probes late by "
                                         "over 50 ms that the loop's thread lost mostly to its virtual CPU's host "
                                         "(steal time, /proc/stat): the machine's doing, not the node's",
                                         registry=r)
        self.loop_tasks = Gauge("parley_event_loop_tasks", "asyncio tasks alive on the event loop (with no "
                                "calls up it should come back to its idle level; growth is a leak)", registry=r)
        self.turn_stage = Histogram("parley_turn_stage_seconds", "Per-reply latency by stage (metrics.turn): "
                                    "end_of_turn, responder_first_token, tts_first_audio, first_frame, total, "
                                    "browser_playout (first frame sent -> the page's playout report)",
                                    ["stage"], buckets=TURN_BUCKETS_S, registry=r)
        self.interruptions = Counter("parley_barge_ins", "Replies the caller interrupted", registry=r)
        self.errors = Counter("parley_call_errors", "error events sent to callers, by code (docs/events.md): "
                              "stt_failed, tts_failed, call_failed, responder_*, bad_message, ...",
                              ["code"], registry=r)
        self.sip_calls = Counter("parley_sip_calls", "SIP INVITEs by outcome: a refusal (busy, unavailable, "
                                 "not_acceptable, cancelled, failed) or an answered call's close reason",
                                 ["outcome"], registry=r)
        self.sip_ignored = Counter("parley_sip_ignored", "SIP datagrams dropped unanswered, by why "
                                   "(not_allowed: source outside sip_allowed_networks; malformed)",
                                   ["reason"], registry=r)
        self._seen_concealed: dict[str, int] = {}
        self._seen_frames: dict[str, int] = {}

    def exposition(self) -> bytes:
        """The Prometheus text format of everything in this registry."""
        return generate_latest(self.registry)

    def observe_event(self, event: dict) -> None:
        """Conversation events that feed metrics (called for every event a call sends)."""
        if event["type"] == "metrics.turn":
            for stage in TURN_STAGES:
                value = event.get(f"{stage}_ms")
                if value is not None:
                    self.turn_stage.labels(stage=stage).observe(value / 1000.0)
        elif event["type"] == "response.interrupted":
            self.interruptions.inc()
        elif event["type"] == "error":
            self.errors.labels(code=event.get("code", "unknown")).inc()

    def call_ended(self, call: "Call") -> None:
        """Count a closed call by outcome and take its last media sample."""
        self.sample_call(call)
        self.calls.labels(outcome=call.close_reason or "unknown").inc()
        self._seen_concealed.pop(call.call_id, None)
        self._seen_frames.pop(call.call_id, None)

    def sample_call(self, call: "Call") -> None:
        """Feed one call's jitter delay, new concealed samples and new pacing lateness samples."""
        jitter = call.playout.buffer.stats
        if jitter.packets_played:
            self.jitter_delay.observe(jitter.current_delay_ms)
        seen = self._seen_concealed.get(call.call_id, 0)
        if jitter.concealed_samples > seen:
            self.concealed.inc(jitter.concealed_samples - seen)
        self._seen_concealed[call.call_id] = jitter.concealed_samples
        frames = call.pacer.stats.frames_sent
        new = frames - self._seen_frames.get(call.call_id, 0)
        self._seen_frames[call.call_id] = frames
        if new > 0:
            limit = min(new, int(SAMPLES_PER_S * SAMPLE_INTERVAL_S * 4))
            for late_ms in call.pacer.lateness_samples()[-limit:]:
                self.lateness.observe(late_ms / 1000.0)

    def sample(self, calls: Iterable["Call"], loop_lags_ms: list[float], loop_busy_ms: Sequence[float] = (),
               loop_queued_ms: Sequence[float] = (), loop_stolen_ms: Sequence[float] = ()) -> None:
        """`loop_busy_ms`, `loop_queued_ms`, `loop_stolen_ms`: the loop thread's ms on a CPU, on a run
        queue, and taken by the host, over each of those probes (when known)."""
        for call in calls:
            self.sample_call(call)
        for lag_ms in loop_lags_ms:
            self.loop_lag.observe(lag_ms / 1000.0)
        causes = [_stall_cause(*probe) for probe in zip(loop_lags_ms, _or_nan(loop_busy_ms, loop_lags_ms),
                                                       _or_nan(loop_queued_ms, loop_lags_ms),
                                                       _or_nan(loop_stolen_ms, loop_lags_ms))]
        if busy := causes.count("busy"):
            self.loop_busy_stalls.inc(busy)
        if queued := causes.count("cpu_wait"):
            self.loop_cpu_wait_stalls.inc(queued)
        if stolen := causes.count("steal"):
            self.loop_steal_stalls.inc(stolen)


class CollectorPauseMetrics(Collector):
    """The process's garbage-collector passes (gateway/heap.py), read when scraped: a process-wide
    figure, like ProcessCollector's, so every app in a process reports the same one."""

    def __init__(self, pauses: heap.CollectorPauses) -> None:
        self.pauses = pauses

    def collect(self) -> Iterator[Metric]:
        pauses = self.pauses
        histogram = HistogramMetricFamily("parley_gc_pause_seconds", "Cyclic garbage-collector passes by "
                                          "generation (2: full), on any thread; each holds the GIL, so the event "
                                          "loop waits it out", labels=["generation"])
        longest = GaugeMetricFamily("parley_gc_pause_longest_seconds", "The longest collector pass since the "
                                    "process started, by generation", labels=["generation"])
        collected = GaugeMetricFamily("parley_gc_collected_objects", "Objects the collector freed (reference "
                                      "cycles) since the process started, by generation", labels=["generation"])
        for generation in range(3):
            label = [str(generation)]
            cumulative = list(itertools.accumulate(pauses.counts[generation]))
            bounds = [floatToGoString(b) for b in heap.GC_PAUSE_BUCKETS_S] + ["+Inf"]
            histogram.add_metric(label, list(zip(bounds, cumulative)), pauses.seconds[generation])
            longest.add_metric(label, pauses.longest_s[generation])
            collected.add_metric(label, pauses.collected[generation])
        yield from (histogram, longest, collected)


def _or_nan(spent_ms: Sequence[float], lags_ms: Sequence[float]) -> Sequence[float]:
    return spent_ms if spent_ms else [math.nan] * len(lags_ms)


def _stall_cause(lag_ms: float, busy_ms: float, queued_ms: float, stolen_ms: float = math.nan) -> str | None:
    """None for a probe on time; else "busy", "cpu_wait", "steal" or "asleep", whichever took the
    largest share of the probe (its interval and its lag; an unknown share, nan, counts as none)."""
    if not lag_ms > STALL_MS:
        return None
    busy, queued, stolen = (0.0 if math.isnan(ms) else ms for ms in (busy_ms, queued_ms, stolen_ms))
    asleep = lag_ms + PROBE_INTERVAL_S * 1000.0 - busy - queued - stolen
    return max((busy, "busy"), (queued, "cpu_wait"), (stolen, "steal"), (asleep, "asleep"))[1]


async def run_sampler(metrics: Metrics, calls: Mapping[str, "Call"], loop_lag: "LoopLagMonitor") -> None:
    """Sample the live calls (call id -> call, read afresh each time) and the event-loop lag
    every SAMPLE_INTERVAL_S until cancelled."""
    seen_probes = loop_lag.probes
    while True:
        await asyncio.sleep(SAMPLE_INTERVAL_S)
        probes = loop_lag.probes
        metrics.sample(list(calls.values()), loop_lag.latest(probes - seen_probes),
                       loop_lag.latest_busy(probes - seen_probes), loop_lag.latest_queued(probes - seen_probes),
                       loop_lag.latest_stolen(probes - seen_probes))
        metrics.loop_tasks.set(len(asyncio.all_tasks()))
        seen_probes = probes

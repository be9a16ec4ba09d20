"""Work that used to stall the event loop (issue 34): catch-up bursts after a stall run one
frame per step, a call's first frame imports nothing, and a hung-up call leaves no task behind."""

import asyncio
import math
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from gateway.pacer import PacedAudioTrack
from gateway.playout import MAX_CATCH_UP_FRAMES, Playout
from tests.kit.peer import RATE, Caller


def suspends(coro) -> bool:
    """Whether the coroutine gives the loop a turn before it finishes (then it is closed)."""
    try:
        coro.send(None)
    except StopIteration:
        return False
    coro.close()
    return True


async def test_pacer_yields_to_the_loop_for_each_frame_of_a_backlog():
    """aiortc's sender calls recv() again as soon as one returns: behind schedule, each frame
    must still suspend once, or the backlog is encoded and sent in one long callback."""
    now = [100.0]
    pacer = PacedAudioTrack(clock=lambda: now[0])
    pacer.write(np.zeros(48000, dtype=np.int16), 48000)
    await pacer.recv()  # starts the clock at t = 100
    now[0] += 0.2  # the loop stalled 200 ms: 10 frames are due at once (under RESYNC_LATE_S)
    for _ in range(10):
        assert suspends(pacer.recv()), "a frame of the backlog was sent without yielding"
        await pacer.recv()


async def test_playout_catch_up_delivers_one_frame_per_loop_turn():
    """After a stall the playout delivers the missed frames (up to MAX_CATCH_UP_FRAMES), each
    in its own step of the task, with other callbacks running in between."""
    turns = 0
    seen: list[int] = []

    async def other_work() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    playout = Playout(lambda pcm: seen.append(turns))
    worker = asyncio.get_running_loop().create_task(other_work())
    playout.start()
    try:
        while len(seen) < 3:
            await asyncio.sleep(0.005)
        time.sleep(0.25)  # a stall: > MAX_CATCH_UP_FRAMES frames fall due at once
        mark = len(seen)
        while len(seen) < mark + MAX_CATCH_UP_FRAMES:
            await asyncio.sleep(0.001)
    finally:
        await playout.stop()
        worker.cancel()
    burst = seen[mark:mark + MAX_CATCH_UP_FRAMES]
    assert len(set(burst)) == len(burst), f"frames delivered in one loop turn: {burst}"


def test_a_calls_echo_suppressor_imports_nothing_on_the_loop():
    """Building a call's suppressor used to import numpy.random and numpy.ma (first call only,
    ~50 ms of CPU on the event loop): the modules load with the gateway instead."""
    code = ("import sys, gateway.echo_suppressor as m; before = set(sys.modules); m.EchoSuppressor()"
            ".process(__import__('numpy').zeros(320, 'int16')); print(sorted(set(sys.modules) - before))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout


def _call_tasks() -> set[asyncio.Task]:
    """Live tasks other than this test's own and aiohttp's per-connection request handlers (an idle
    keep-alive connection holds one; how many the client keeps open is not the gateway's doing)."""
    current = asyncio.current_task()
    return {t for t in asyncio.all_tasks()
            if t is not current and "RequestHandler" not in getattr(t.get_coro(), "__qualname__", "")}


async def test_a_hung_up_call_leaves_no_task_behind(start_gateway, http):
    gateway = await start_gateway(echo_delay_ms=100, stats_interval_s=0.2)
    idle = _call_tasks()
    for _ in range(2):
        caller = Caller(gateway.url, np.zeros(RATE, dtype=np.float32))
        await caller.call(http)
        await caller.wait_connected()
        await caller.wait_for_event("call.stats")
        assert len(_call_tasks()) > len(idle)
        assert await caller.hang_up(http) == 204
    deadline = time.monotonic() + 15
    while (left := _call_tasks() - idle) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert not left, [repr(t)[:160] for t in left]
    assert not gateway.registry.calls


async def test_hanging_up_joins_aiortcs_idle_decoder_thread_off_the_loop(start_gateway, http, monkeypatch):
    """RTCRtpReceiver.stop() joins its decoder thread where it runs: at hang-up that wait (for
    the thread to win the GIL back from the engine's) was the event loop's."""
    import threading

    joins: list[bool] = []  # per join of the gateway's decoder thread: was it on the loop's thread?
    loop_thread, join = threading.current_thread(), threading.Thread.join
    gateway = await start_gateway(echo_delay_ms=100)
    caller = Caller(gateway.url, np.zeros(RATE, dtype=np.float32))
    await caller.call(http)
    await caller.wait_connected()
    [call] = gateway.registry.calls.values()
    [decoder] = [receiver._RTCRtpReceiver__decoder_thread for receiver in call.pc.getReceivers()]

    def watched_join(thread: threading.Thread, timeout=None) -> None:
        if thread is decoder:
            joins.append(threading.current_thread() is loop_thread)
        join(thread, timeout)

    monkeypatch.setattr(threading.Thread, "join", watched_join)
    assert await caller.hang_up(http) == 204
    await call.closed.wait()
    assert joins == [False], f"the decoder thread's joins, on the loop (True) or off it: {joins}"
    assert not decoder.is_alive()


async def test_a_stall_counts_as_busy_only_when_the_loop_thread_ran():
    """parley_event_loop_busy_stalls tells code blocking the loop (its thread on a CPU) from a
    process that waited (for a CPU on a busy machine, or for the GIL): both are late timers."""
    from gateway.loop_monitor import LoopLagMonitor
    from gateway.metrics import Metrics

    monitor, metrics = LoopLagMonitor(), Metrics()
    monitor.start()
    try:
        await asyncio.sleep(0.05)
        seen = monitor.probes
        time.sleep(0.15)  # waiting, not computing: a late timer, no busy stall
        await asyncio.sleep(0.03)
        metrics.sample([], monitor.latest(monitor.probes - seen), monitor.latest_busy(monitor.probes - seen))
        assert max(monitor.latest(monitor.probes - seen)) > 100
        assert metrics.loop_busy_stalls._value.get() == 0
        if os.path.exists("/proc/stat"):  # each probe read the host's steal too (0 on bare metal)
            assert not any(math.isnan(ms) for ms in monitor.latest_stolen(monitor.probes - seen))
        for _ in range(5):  # on a loaded machine the loop thread may not get a CPU for it: again
            seen, wall, cpu = monitor.probes, time.monotonic(), time.thread_time()
            while time.thread_time() - cpu < 0.15:  # computing on the loop
                pass
            ran = time.monotonic() - wall < 0.25  # the thread was on a CPU for most of the stall
            await asyncio.sleep(0.03)
            metrics.sample([], monitor.latest(monitor.probes - seen), monitor.latest_busy(monitor.probes - seen))
            if ran:
                break
        assert ran, "this machine never gave the loop thread 0.15 s of CPU within 0.25 s"
        assert metrics.loop_busy_stalls._value.get() == 1
    finally:
        await monitor.stop()


def test_stalls_are_told_apart_by_where_the_loop_thread_spent_them():
    """Each late probe counts by where most of its time went: on a CPU (busy), on a run queue
    (CPU wait), or neither (asleep on the GIL: counted by neither counter). The loop's own work
    stretched by waiting for a core is busy: no share alone need reach 50 ms."""
    from gateway.metrics import Metrics

    metrics = Metrics()
    lags = [120.0, 120.0, 120.0, 120.0, 30.0, 60.0, 60.0]
    on_cpu = [100.0, 5.0, 5.0, 5.0, 30.0, 38.0, 20.0]
    on_run_queue = [5.0, 100.0, 5.0, float("nan"), 30.0, 25.0, 38.0]
    metrics.sample([], lags, on_cpu, on_run_queue)
    assert metrics.loop_busy_stalls._value.get() == 2
    assert metrics.loop_cpu_wait_stalls._value.get() == 2
    metrics.sample([], [200.0], [], [])  # no thread figures at all: asleep, as far as anyone can tell
    assert metrics.loop_busy_stalls._value.get() == 2
    assert metrics.loop_cpu_wait_stalls._value.get() == 2
    assert metrics.loop_steal_stalls._value.get() == 0


def test_a_stall_the_host_took_counts_as_steal():
    """On a virtual machine the host may take the loop thread's CPU away: that time is neither
    the thread's CPU time nor run-queue wait, and without /proc/stat's steal it would pass for
    the GIL. A stall counts as steal where steal took its largest share."""
    from gateway.metrics import Metrics

    metrics = Metrics()
    lags = [120.0, 120.0, 120.0, 120.0]
    on_cpu = [10.0, 60.0, 10.0, 10.0]
    on_run_queue = [10.0, 10.0, 10.0, 10.0]
    stolen = [80.0, 40.0, 30.0, float("nan")]  # the third: 90 ms asleep outweighs 30 ms stolen
    metrics.sample([], lags, on_cpu, on_run_queue, stolen)
    assert metrics.loop_steal_stalls._value.get() == 1
    assert metrics.loop_busy_stalls._value.get() == 1
    assert metrics.loop_cpu_wait_stalls._value.get() == 0


def test_the_steal_of_the_loop_threads_cpu_is_read_from_proc_stat():
    """/proc/stat's steal column (the 8th field, in clock ticks) of the CPU named, the most of
    those the thread was on; a CPU the file does not list says nothing."""
    from gateway.loop_monitor import TICK_S, current_cpu, stolen_s

    then = b"cpu  1 2 3 4 5 6 7 10 0 0\ncpu0 1 2 3 4 5 6 7 4 0 0\ncpu1 1 2 3 4 5 6 7 6 0 0\nintr 1\n"
    now = b"cpu  1 2 3 4 5 6 7 19 0 0\ncpu0 1 2 3 4 5 6 7 5 0 0\ncpu1 1 2 3 4 5 6 7 14 0 0\nintr 1\n"
    assert stolen_s(then, now, {0}) == pytest.approx(1 * TICK_S)
    assert stolen_s(then, now, {0, 1}) == pytest.approx(8 * TICK_S)
    assert math.isnan(stolen_s(then, now, {7})) and math.isnan(stolen_s(then, now, {-1}))
    if sys.platform == "linux":
        assert current_cpu() in os.sched_getaffinity(0)


async def test_a_loop_sharing_its_cpu_with_busy_processes_counts_a_cpu_wait_stall():
    """Busy processes pinned to the loop thread's CPU: a stretch of work on the loop then spends
    most of its time on the run queue, and the monitor reads that from the kernel
    (/proc/thread-self/schedstat) and counts a CPU-wait stall, not a busy one."""
    import math
    import os

    from gateway.loop_monitor import LoopLagMonitor
    from gateway.metrics import Metrics

    monitor, metrics = LoopLagMonitor(), Metrics()
    monitor.start()
    allowed = os.sched_getaffinity(0)
    cpu = min(allowed)
    os.sched_setaffinity(0, {cpu})  # (this thread: the loop's)
    hogs = [subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"])
            for _ in range(4)]
    try:
        await asyncio.sleep(0.3)  # the hogs running
        seen = monitor.probes
        wall = time.monotonic()
        while time.monotonic() - wall < 0.6:  # work on the loop, a fifth of a CPU its share
            pass
        await asyncio.sleep(0.05)
        queued = monitor.latest_queued(monitor.probes - seen)
        assert queued and not any(math.isnan(ms) for ms in queued), "no run-queue figures from the kernel"
        assert max(queued) > 300.0, f"0.6 s beside 4 busy processes, yet at most {max(queued):.0f} ms queued"
        metrics.sample([], monitor.latest(monitor.probes - seen), monitor.latest_busy(monitor.probes - seen), queued)
        assert metrics.loop_cpu_wait_stalls._value.get() >= 1
        assert metrics.loop_busy_stalls._value.get() == 0
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        os.sched_setaffinity(0, allowed)
        await monitor.stop()

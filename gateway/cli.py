"""`parley` command line: `parley serve [--flags]` (also `python -m gateway serve`), `parley
config` (the effective configuration), `parley say TEXT --out FILE.wav` (the shipped voice,
offline: how a reply will sound) and `parley replay REC.wav` (a call recorded with
`record_dir`, replayed offline: when each caller turn was heard to start and to end;
gateway/replay.py).

Signals: the first SIGTERM drains (readyz 503, new calls 503, live calls continue up to
drain_timeout_s, then session.migrate and close), and the process exits 0 when no calls
remain; a second SIGTERM, or SIGINT at any time, stops at once (calls closed with reason
"shutdown", exit 0).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from typing import Optional, Sequence

from aiohttp import web

from engine import single_threaded_blas

from . import config as config_module
from . import heap, logs
from . import replay as replay_module
from .app import CALLS_KEY, WARMUP_KEY, create_app
from .registry import CallRegistry
from .ice import use_host_addresses

log = logging.getLogger("parley")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="parley", description="Parley voice gateway")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the gateway")
    config_module.add_arguments(serve)
    printer = commands.add_parser("config", help="print the effective configuration and exit")
    config_module.add_config_file_argument(printer)
    say = commands.add_parser("say", help="speak TEXT with the shipped voice into a WAV file and exit")
    say.add_argument("text", help="what to say (numbers, money, dates and times are read out)")
    say.add_argument("--out", required=True, help="the WAV file to write (22.05 kHz, 16-bit mono)")
    replay = commands.add_parser("replay", help="replay a call recorded with record_dir through the echo suppressor "
                                                 "and the recognizer, and report its turns")
    replay_module.add_arguments(replay)
    return parser


def say(text: str, out: str) -> int:
    """The same synthesis a call's replies go through, offline, into a WAV file."""
    import engine

    if not text.strip():
        print("parley say: nothing to say (TEXT is empty)", file=sys.stderr)
        return 2
    seconds = engine.say(text, out)
    print(f"wrote {out}: {seconds:.2f} s", flush=True)
    return 0


# The event loop lets go of the GIL at every socket, libopus and SRTP call (hundreds a second
# with 8 calls up) and may then wait up to this long for an engine thread to hand it back. At
# Python's 5 ms those waits added up to loop stalls of 100-600 ms; at 1 ms an 8-call soak had
# 73 % fewer stalls over 50 ms, and served 16 % more turns.
GIL_SWITCH_INTERVAL_S = 0.001


async def serve(config: config_module.Config) -> None:
    use_host_addresses(config.ice_addresses)
    single_threaded_blas()  # numpy's idle BLAS threads spin: on a small node they ate a core's share
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    app = create_app(config)
    # heap.tune() left full collector passes to it; they begin once the engine is loaded and frozen
    collection = heap.ScheduledCollection(warm=app[WARMUP_KEY].done)
    collection.start()
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port)
    await site.start()
    port = runner.addresses[0][1] if runner.addresses else config.port
    log.info("listening", extra={"url": f"http://{config.host}:{port}", "mode": config.mode})
    print(f"Parley listening on http://{config.host}:{port} (mode {config.mode})", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, _on_sigterm, app[CALLS_KEY], config, stop)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    await stop.wait()
    app[CALLS_KEY].draining = True
    await runner.cleanup()
    await collection.stop()


def _on_sigterm(registry: CallRegistry, config: config_module.Config, stop: asyncio.Event) -> None:
    """First SIGTERM: drain, then stop. Second: stop now."""
    if registry.draining:
        log.warning("second SIGTERM: stopping now")
        stop.set()
        return
    log.info("SIGTERM: draining", extra={"drain_timeout_s": config.drain_timeout_s})
    registry.start_drain(config.drain_timeout_s).add_done_callback(lambda _: stop.set())


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "say":
        return say(args.text, args.out)
    if args.command == "replay":
        return replay_module.run(args)
    try:
        config = config_module.load(args)
    except config_module.ConfigError as exc:
        print(f"parley: configuration error: {exc}", file=sys.stderr)
        return 2
    logs.setup(config.log_level)
    print("Parley configuration: " + json.dumps(config.masked(), sort_keys=True), flush=True)
    if args.command == "config":
        return 0
    heap.tune()
    asyncio.run(serve(config))
    return 0

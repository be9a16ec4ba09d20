"""`parley` command line: `parley serve [--flags]` (also `python -m gateway serve`)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from typing import Optional, Sequence

from aiohttp import web

from . import config as config_module
from . import logs
from .app import CALLS_KEY, create_app
from .ice import use_host_addresses

log = logging.getLogger("parley")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="parley", description="Parley voice gateway")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the gateway")
    config_module.add_arguments(serve)
    commands.add_parser("config", help="print the effective configuration and exit")
    return parser


async def serve(config: config_module.Config) -> None:
    use_host_addresses(config.ice_addresses)
    app = create_app(config)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port)
    await site.start()
    port = runner.addresses[0][1] if runner.addresses else config.port
    log.info("listening", extra={"url": f"http://{config.host}:{port}", "mode": config.mode})
    print(f"Parley listening on http://{config.host}:{port} (mode {config.mode})", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    app[CALLS_KEY].draining = True
    await runner.cleanup()


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = config_module.load(args if args.command == "serve" else None)
    except config_module.ConfigError as exc:
        print(f"parley: configuration error: {exc}", file=sys.stderr)
        return 2
    logs.setup(config.log_level)
    print("Parley configuration: " + json.dumps(config.masked(), sort_keys=True), flush=True)
    if args.command == "config":
        return 0
    asyncio.run(serve(config))
    return 0

"""Real `python -m gateway serve` processes for tests that signal or kill a node."""

from __future__ import annotations

import asyncio
import os
import re
import sys

import aiohttp

DEADLINE_S = 60.0  # generous: the machine may be busy
BASE_ENV = {**os.environ, "PARLEY_ICE_ADDRESSES": "127.0.0.1", "PARLEY_LOG_LEVEL": "warning"}


async def start_server(*flags: str, env: dict[str, str] | None = None, prefix: tuple[str, ...] = (),
                       log_path: str | None = None) -> tuple[asyncio.subprocess.Process, str]:
    """Start a node on a free port; returns it with its URL once it listens. `prefix` runs it
    under another command (`ip netns exec <namespace>`: tests/kit/netem.py); its log (stderr)
    goes to `log_path` if given."""
    with open(log_path or os.devnull, "ab") as log:
        proc = await asyncio.create_subprocess_exec(
            *prefix, sys.executable, "-m", "gateway", "serve", "--port", "0", *flags,
            stdout=asyncio.subprocess.PIPE, stderr=log, env={**BASE_ENV, **(env or {})})
    while True:
        line = (await asyncio.wait_for(proc.stdout.readline(), DEADLINE_S)).decode()
        assert line, "the server exited before listening"
        match = re.search(r"listening on (http://\S+)", line)
        if match:
            return proc, match.group(1)


async def wait_ready(http: aiohttp.ClientSession, url: str) -> None:
    deadline = asyncio.get_running_loop().time() + DEADLINE_S
    while True:
        async with http.get(url + "/readyz") as response:
            if response.status == 200:
                return
        assert asyncio.get_running_loop().time() < deadline, "never ready"
        await asyncio.sleep(0.1)


async def kill(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.kill()
        await proc.wait()

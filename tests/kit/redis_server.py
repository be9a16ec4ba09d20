"""A throwaway redis-server on a free loopback port, without persistence (tests only)."""

from __future__ import annotations

import shutil
import subprocess
import time
from typing import Optional

import redis

REDIS_SERVER = shutil.which("redis-server")
REDIS_START_DEADLINE_S = 10.0
POLL_S = 0.05


class RedisServer:
    def __init__(self, port: Optional[int] = None) -> None:
        from tests.kit.ports import free_port

        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: Optional[subprocess.Popen] = None
        self.client = redis.Redis(port=self.port, decode_responses=True, socket_timeout=1)
        self.start()

    def start(self) -> None:
        """Start (or restart, on the same port and empty) and wait for PING."""
        self.process = subprocess.Popen(
            [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + REDIS_START_DEADLINE_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.process.returncode}")
            try:
                if self.client.ping():
                    return
            except redis.ConnectionError:
                time.sleep(POLL_S)
        self.stop()
        raise RuntimeError(f"redis-server did not answer PING within {REDIS_START_DEADLINE_S} s")

    def stop(self) -> None:
        """Kill it (SIGKILL: no goodbye to clients, like a crash)."""
        self.client.connection_pool.disconnect()
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

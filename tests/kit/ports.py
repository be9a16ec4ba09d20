"""A free local port (for gateway and Redis processes started by tests and benchmarks)."""

import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

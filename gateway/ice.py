"""ICE host candidates: which local addresses Parley offers for media.

aioice gathers a host candidate on every interface except 127.0.0.1. A gateway usually
wants media on one known interface (the one its firewall or load balancer forwards), and
tests want loopback only, so the list is configurable (`ice_addresses`). The UDP ports
can be confined to a range (`media_ports`) for firewalls.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import random

import aioice.ice

_original_get_host_addresses = aioice.ice.get_host_addresses


def use_host_addresses(addresses: list[str]) -> None:
    """Gather host candidates only on `addresses` (all interfaces when empty)."""
    if not addresses:
        aioice.ice.get_host_addresses = _original_get_host_addresses
        return
    chosen = list(addresses)

    def get_host_addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
        return [a for a in chosen if (":" in a and use_ipv6) or (":" not in a and use_ipv4)]

    aioice.ice.get_host_addresses = get_host_addresses


def parse_port_range(text: str) -> tuple[int, int]:
    """"40000-40999" -> (40000, 40999); ValueError with the reason otherwise."""
    first, sep, last = text.partition("-")
    if not sep or not first.strip().isdigit() or not last.strip().isdigit():
        raise ValueError(f"{text!r} is not a port range like 40000-40999")
    low, high = int(first), int(last)
    if not 1024 <= low <= high <= 65535:
        raise ValueError(f"{text!r} must satisfy 1024 <= first <= last <= 65535")
    return low, high


def bind_media_ports(loop: asyncio.AbstractEventLoop, first: int, last: int) -> None:
    """Make every UDP socket this loop opens on port 0 (aioice's ICE candidates) take a port
    in [first, last] instead, so a firewall or security group can open exactly that range."""
    original = loop.create_datagram_endpoint
    ports = itertools.cycle(random.sample(range(first, last + 1), last - first + 1))

    async def create_datagram_endpoint(protocol_factory, local_addr=None, **kwargs):
        if local_addr is None or local_addr[1] != 0:
            return await original(protocol_factory, local_addr=local_addr, **kwargs)
        for _ in range(last - first + 1):
            try:
                return await original(protocol_factory, local_addr=(local_addr[0], next(ports)), **kwargs)
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise
        raise OSError(errno.EADDRINUSE, f"no free UDP port in the media range {first}-{last}")

    loop.create_datagram_endpoint = create_datagram_endpoint  # type: ignore[method-assign]

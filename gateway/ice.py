"""ICE host candidates: which local addresses Parley offers for media.

aioice gathers a host candidate on every interface except 127.0.0.1. A gateway usually
wants media on one known interface (the one its firewall or load balancer forwards), and
tests want loopback only, so the list is configurable (`ice_addresses`).
"""

from __future__ import annotations

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

"""Who the client is, behind reverse proxies the operator trusts (for per-IP rate limits).

Without trusted proxies (the default) the client is the direct peer, and X-Forwarded-For is
ignored: anyone can write that header. With `trusted_proxies` (CIDRs), and only when the
direct peer is in one of them, the header is read from the right (each proxy appends the
address it was reached from): trusted addresses are skipped, and the first untrusted one is
the client. Addresses to the left of it were written by the client itself and are never read.
If every address is trusted, the left-most is the client; an entry that is not an address
stops the walk at the hop that wrote it (the client is that trusted hop: a stricter limit,
never a way around it).
"""

from __future__ import annotations

import ipaddress
from typing import Iterable, Optional, Sequence, Union

IPAddress = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]
IPNetwork = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]
MAX_FORWARDED_HOPS = 32  # addresses read from the right at most; a longer chain is cut there


def parse_networks(cidrs: Iterable[str]) -> tuple[IPNetwork, ...]:
    """CIDRs ("10.0.0.0/8", "192.0.2.7", "::1/128") as networks; ValueError names a bad one."""
    networks = []
    for cidr in cidrs:
        try:
            networks.append(ipaddress.ip_network(cidr.strip(), strict=False))
        except ValueError:
            raise ValueError(f"{cidr!r} is not an address or a CIDR (e.g. 10.0.0.0/8, 192.0.2.7)") from None
    return tuple(networks)


def parse_address(text: str) -> Optional[IPAddress]:
    """An address as proxies write it ("198.51.100.7", "198.51.100.7:4711", "[2001:db8::1]:443",
    "2001:db8::1"), IPv4-mapped IPv6 as IPv4; None when it is none of these ("unknown", junk)."""
    text = text.strip()
    if text.startswith("["):
        text = text[1:].partition("]")[0]
    elif text.count(":") == 1:  # IPv4 with a port
        text = text.partition(":")[0]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def is_trusted(address: IPAddress, trusted: Sequence[IPNetwork]) -> bool:
    return any(address.version == network.version and address in network for network in trusted)


def client_address(peer: Optional[str], forwarded_for: Sequence[str], trusted: Sequence[IPNetwork]) -> str:
    """The client's address as text: `peer` (the TCP peer), unless it is a trusted proxy and
    `forwarded_for` (every X-Forwarded-For header's value, in order) names one further out."""
    if peer is None:
        return "unknown"
    hop = parse_address(peer)
    if hop is None or not trusted or not is_trusted(hop, trusted):
        return str(hop) if hop is not None else peer
    entries = [entry for value in forwarded_for for entry in value.split(",") if entry.strip()]
    for entry in reversed(entries[-MAX_FORWARDED_HOPS:]):
        address = parse_address(entry)
        if address is None:
            break  # not an address: the trusted hop that wrote it is as far as this goes
        hop = address
        if not is_trusted(address, trusted):
            break
    return str(hop)

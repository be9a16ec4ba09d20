"""Network impairment for tests and benchmarks: the gateway in a network namespace of its
own, joined to the caller's namespace by a veth pair, with tc netem on both ends.

    root namespace (the caller)  veth 10.34.<n>.2  <->  10.34.<n>.1  namespace parley-gw-<n>
                                 netem: caller -> gateway              netem: gateway -> caller

Needs root, `ip` and `tc`, and a kernel with sch_netem; `unavailable()` says which is
missing, so a test can skip with that reason. Everything made here is removed on close.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from typing import Optional

# The three impairments of issue 34, as netem arguments (applied in each direction).
PROFILES: dict[str, list[str]] = {
    "clean": [],
    "loss_5pct": ["loss", "random", "5%"],
    # 40 ms of jitter around a 40 ms delay: packets 20 ms apart overtake each other, so
    # netem reorders them (no rate limit keeps them in order).
    "jitter_40ms": ["delay", "40ms", "40ms", "distribution", "normal"],
    # Gilbert-Elliott: a bad state that drops everything and lasts 1/r = 10 packets
    # (200 ms) on average, entered with p = 0.25 % per packet: ~2.4 % of packets lost, in bursts.
    "bursts_200ms": ["loss", "gemodel", "0.25%", "10%", "100%", "0%"],
}


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=30)


def unavailable(netem: bool = True) -> Optional[str]:
    """Why impairment (or, with netem=False, just the namespaces) cannot be set up here."""
    if os.geteuid() != 0:
        return "network namespaces and tc netem need root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` (iproute2) is not installed"
    probe = f"parley-probe-{os.getpid()}"
    made = _run("ip", "netns", "add", probe)
    if made.returncode != 0:
        return f"`ip netns add` fails here: {made.stderr.strip()}"
    try:
        if not netem:
            return None
        qdisc = _run("ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms")
        if qdisc.returncode != 0:
            return f"tc netem is unavailable (this kernel has no sch_netem?): {qdisc.stderr.strip()}"
    finally:
        _run("ip", "netns", "del", probe)
    return None


@dataclass
class ImpairedPath:
    """A gateway namespace and a veth pair; `apply(profile)` sets netem on both ends."""

    index: int

    def __post_init__(self) -> None:
        self.namespace = f"parley-gw-{self.index}"
        self.outer, self.inner = f"pv{self.index}o", f"pv{self.index}i"
        self.gateway_ip, self.caller_ip = f"10.34.{self.index}.1", f"10.34.{self.index}.2"

    def open(self) -> "ImpairedPath":
        steps = [
            ("ip", "netns", "add", self.namespace),
            ("ip", "link", "add", self.outer, "type", "veth", "peer", "name", self.inner),
            ("ip", "link", "set", self.inner, "netns", self.namespace),
            ("ip", "addr", "add", f"{self.caller_ip}/24", "dev", self.outer),
            ("ip", "link", "set", self.outer, "up"),
            ("ip", "-n", self.namespace, "addr", "add", f"{self.gateway_ip}/24", "dev", self.inner),
            ("ip", "-n", self.namespace, "link", "set", self.inner, "up"),
            ("ip", "-n", self.namespace, "link", "set", "lo", "up"),
        ]
        for step in steps:
            done = _run(*step)
            if done.returncode != 0:
                self.close()
                raise RuntimeError(f"{' '.join(step)}: {done.stderr.strip()}")
        return self

    def apply(self, profile: str) -> None:
        """netem `profile` on both directions (the clean profile removes any)."""
        for prefix, device in ((("ip", "netns", "exec", self.namespace), self.inner), ((), self.outer)):
            _run(*prefix, "tc", "qdisc", "del", "dev", device, "root")
            if PROFILES[profile]:
                done = _run(*prefix, "tc", "qdisc", "add", "dev", device, "root", "netem", *PROFILES[profile])
                if done.returncode != 0:
                    raise RuntimeError(f"netem {profile} on {device}: {done.stderr.strip()}")

    def command(self, *argv: str) -> list[str]:
        """argv run inside the gateway's namespace."""
        return ["ip", "netns", "exec", self.namespace, *argv]

    def close(self) -> None:
        _run("ip", "link", "del", self.outer)  # takes its peer with it
        _run("ip", "netns", "del", self.namespace)

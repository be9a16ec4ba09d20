"""A process's resident memory, read from /proc: what the soak, the fuzzer and the memory tests watch."""

from __future__ import annotations


def rss_mib(pid: int | str = "self") -> float:
    """Resident set size of `pid` (this process by default) in MiB."""
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 1024

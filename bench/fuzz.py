"""Fuzz benchmark (not in CI): every gateway input parser on 100k+ inputs, with crash, hang
and memory figures.

The targets are tests/kit/fuzz_targets.py (the same ones the property tests in
tests/test_properties.py run on a few hundred inputs): the SDP offer, the JSON body of
POST /v1/calls, data-channel messages, resume tokens and RTP payloads into the jitter
buffer. Inputs come from a mutator seeded with valid inputs (bit flips, byte inserts and
deletes, repeated and spliced chunks, truncation) and from plain random bytes, drawn from
one seeded generator, so a run is reproducible.

    crash   any exception other than the parser's documented refusal
    hang    one input taking longer than --hang-s (an interval timer interrupts it)
    memory  RSS after the first tenth of the inputs (warm caches) against the end

Output: one JSON object on stdout; progress on stderr.
Usage: python bench/fuzz.py --inputs 100000 --json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.kit.fuzz_targets import seeds, targets  # noqa: E402
from tests.kit.memory import rss_mib  # noqa: E402

MAX_INPUT_BYTES = 4096
CRASH_EXAMPLES = 5  # kept per target (the first of each distinct failure)


class Hang(Exception):
    """Raised by the interval timer inside an input that ran past --hang-s."""


def mutate(rng: random.Random, seed: bytes, other: bytes) -> bytes:
    data = bytearray(seed)
    for _ in range(rng.randint(1, 8)):
        op = rng.randrange(7)
        at = rng.randint(0, len(data))
        if op == 0 and data:  # flip a bit
            i = rng.randrange(len(data))
            data[i] ^= 1 << rng.randrange(8)
        elif op == 1:  # insert random bytes
            data[at:at] = rng.randbytes(rng.randint(1, 16))
        elif op == 2 and data:  # delete a run
            del data[at:at + rng.randint(1, 64)]
        elif op == 3 and data:  # repeat a chunk
            chunk = data[at:at + rng.randint(1, 64)]
            data[at:at] = chunk * rng.randint(1, 20)
        elif op == 4:  # splice with another seed
            cut = rng.randint(0, len(other))
            data = data[:at] + bytearray(other[cut:])
        elif op == 5:  # truncate
            del data[at:]
        else:  # an interesting byte: quotes, separators, high bytes
            data[at:at] = bytes([rng.choice(b'"{}[]:,.=\r\n\\\x00\xff\xe8-0123456789')])
    return bytes(data[:MAX_INPUT_BYTES])


def next_input(rng: random.Random, pool: list[bytes]) -> bytes:
    if rng.random() < 0.15:
        return rng.randbytes(rng.randint(0, 256))
    return mutate(rng, rng.choice(pool), rng.choice(pool))


def run_target(name: str, target: Callable[[bytes], None], pool: list[bytes], inputs: int,
               hang_s: float, rng: random.Random) -> dict[str, Any]:
    crashes: dict[str, dict[str, Any]] = {}
    crash_count = hangs = 0
    slowest_ms = 0.0
    rss_warm: Optional[float] = None
    started = time.monotonic()
    signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(Hang()))
    for i in range(inputs):
        data = next_input(rng, pool)
        t0 = time.perf_counter()
        signal.setitimer(signal.ITIMER_REAL, hang_s)
        try:
            target(data)
        except Hang:
            hangs += 1
        except Exception as exc:  # noqa: BLE001 - any other exception is the finding
            crash_count += 1
            where = traceback.extract_tb(exc.__traceback__)[-1]
            key = f"{type(exc).__name__} at {Path(where.filename).name}:{where.lineno}"
            if key not in crashes and len(crashes) < CRASH_EXAMPLES:
                crashes[key] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}", "input_hex": data[:200].hex()}
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        slowest_ms = max(slowest_ms, (time.perf_counter() - t0) * 1000)
        if i + 1 == max(1, inputs // 10):
            rss_warm = rss_mib()
        if (i + 1) % 20_000 == 0:
            print(f"{name}: {i + 1} inputs, {crash_count} crashes, {hangs} hangs", file=sys.stderr)
    rss_end = rss_mib()
    elapsed = time.monotonic() - started
    return {"inputs": inputs, "crashes": crash_count, "hangs": hangs, "distinct_crashes": crashes,
            "slowest_input_ms": round(slowest_ms, 1), "inputs_per_s": round(inputs / elapsed),
            "rss_mib_after_first_tenth": round(rss_warm or rss_end, 1), "rss_mib_end": round(rss_end, 1),
            "rss_growth_pct": round(100 * (rss_end - (rss_warm or rss_end)) / (rss_warm or rss_end), 2)}


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", type=int, default=100_000, help="inputs per parser")
    parser.add_argument("--hang-s", type=float, default=1.0, help="one input taking longer is a hang")
    parser.add_argument("--only", default="", help="comma-separated target names (default: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="(the output is always JSON)")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    pools = seeds()
    chosen = [n for n in args.only.split(",") if n] or list(pools)
    results = {}
    for name, target in targets().items():
        if name in chosen:
            results[name] = run_target(name, target, pools[name], args.inputs, args.hang_s, rng)
    summary = {
        "parsers": results,
        "total_inputs": sum(r["inputs"] for r in results.values()),
        "total_crashes": sum(r["crashes"] for r in results.values()),
        "total_hangs": sum(r["hangs"] for r in results.values()),
        "max_rss_growth_pct": max(r["rss_growth_pct"] for r in results.values()),
        "settings": {"inputs": args.inputs, "hang_s": args.hang_s, "seed": args.seed},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
    }
    print(json.dumps(summary, indent=2))
    return 0 if summary["total_crashes"] == 0 and summary["total_hangs"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

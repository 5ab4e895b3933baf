"""Checksum throughput on one core, per algorithm, beside a plain memory copy of the same bytes.

    python benchmarks/hashing.py [--mib 256] [--repeat 5]

One JSON line per algorithm: the median GB/s of interleaved repetitions over the same
buffer (already in memory, as a file just written is in the page cache). hpckit records
XXH3-128; SHA-256 is what manifests before format 3 recorded. BLAKE3 and CRC32C are measured
when their packages (blake3, google-crc32c) are installed, as candidates that were weighed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import time
from collections.abc import Callable

import xxhash


def candidates(staging: bytearray) -> dict[str, Callable[[bytes], object]]:
    """Each algorithm by name; the baseline copies into ``staging``, allocated once (a fresh
    allocation would time the page faults)."""
    found: dict[str, Callable[[bytes], object]] = {
        "memory copy (baseline)": lambda data: memoryview(staging).__setitem__(slice(None), data),
        "xxh3-128 (hpckit)": lambda data: xxhash.xxh3_128(data).digest(),
        "sha256 (format 1-2)": lambda data: hashlib.sha256(data).digest(),
    }
    try:
        import blake3
        found["blake3 (one thread)"] = lambda data: blake3.blake3(data).digest()
    except ImportError:
        pass
    try:
        import google_crc32c
        found["crc32c"] = lambda data: google_crc32c.value(data)
    except ImportError:
        pass
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    data = os.urandom(args.mib << 20)
    staging = bytearray(data)
    timings: dict[str, list[float]] = {name: [] for name in candidates(staging)}
    for _ in range(args.repeat):
        for name, run in candidates(staging).items():
            started = time.perf_counter()
            run(data)
            timings[name].append(time.perf_counter() - started)
    for name, seconds in timings.items():
        median = statistics.median(seconds)
        print(json.dumps({"benchmark": "hashing", "algorithm": name, "mib": args.mib,
                          "median_s": round(median, 4),
                          "gb_per_s": round(len(data) / median / 1e9, 2),
                          "repetitions": args.repeat}), flush=True)


if __name__ == "__main__":
    main()

"""Does a checkpoint's background work hold the GIL? The training thread's longest stall.

    python benchmarks/gil_stalls.py [--mib 64] [--repeat 5]

The main thread runs a Python loop that notes the longest gap between its iterations (as a
training loop's Python between CUDA/CPU kernels would feel it) while one background thread
does one piece of a checkpoint's work on ``--mib`` of tensors: ``torch.save`` into a file,
XXH3-128 and SHA-256 of the file, and hpckit's persist (kernel copy, hash, fsync). Baseline:
the same loop while the background thread sleeps. A piece that holds the GIL shows as a
stall as long as the piece itself; one that releases it, as a few milliseconds (the GIL's
5 ms switch interval at most). One JSON line per piece: median of the longest stalls over
``--repeat`` repetitions, and the piece's own time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable

import torch
import xxhash

from hpckit.storage.copy import SHA256
from hpckit.storage.copy import checksum_file, persist_file
from hpckit.storage.location import local


def longest_stall(work: Callable[[], object]) -> tuple[float, float]:
    """(the main thread's longest gap while ``work`` ran on a thread, ``work``'s duration)."""
    done = threading.Event()
    took = [0.0]

    def background() -> None:
        started = time.perf_counter()
        work()
        took[0] = time.perf_counter() - started
        done.set()

    thread = threading.Thread(target=background)
    longest, last = 0.0, time.perf_counter()
    thread.start()
    while not done.is_set():
        now = time.perf_counter()
        longest, last = max(longest, now - last), now
    thread.join()
    return longest, took[0]


def save_into(state: dict, path: str) -> None:
    with open(path, "wb") as f:
        torch.save(state, f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    state = {"model": torch.randn(args.mib << 18)}
    with tempfile.TemporaryDirectory() as d:
        saved, copied = os.path.join(d, "state.pt"), os.path.join(d, "copy.pt")
        torch.save(state, saved)
        pieces: dict[str, Callable[[], object]] = {
            "sleep (baseline)": lambda: time.sleep(0.1),
            "torch.save to a path": lambda: torch.save(state, saved),
            "torch.save to a file object (save_state)": lambda: save_into(state, saved),
            "xxh3-128 of the file": lambda: checksum_file(saved),
            "sha256 of the file": lambda: checksum_file(saved, algorithm=SHA256),
            "persist (copy, hash, fsync)": lambda: persist_file(saved, local(copied)),
            "xxh3-128 in memory": lambda: xxhash.xxh3_128(state["model"].numpy()).digest(),
        }
        for name, work in pieces.items():
            runs = [longest_stall(work) for _ in range(args.repeat)]
            print(json.dumps({
                "benchmark": "gil_stalls", "piece": name, "mib": args.mib,
                "longest_stall_ms": round(1000 * statistics.median(r[0] for r in runs), 2),
                "piece_ms": round(1000 * statistics.median(r[1] for r in runs), 1),
                "repetitions": args.repeat}), flush=True)


if __name__ == "__main__":
    main()

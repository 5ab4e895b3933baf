"""Start-up benchmark: JSON lines, medians of interleaved repetitions.

    python benchmarks/startup.py [--repeat 5] [--before REV]

Figures: the time to import hpckit, hpckit.torch and torch (the baseline: a program that
uses torch pays for it anyway); for ``python examples/linear.py --workers 2 --epochs 1``, the
"ready in" that rank 0 logs (from the start of the command to the first step) and the wall
time of the whole command. With ``--before REV`` the same command also runs from a checkout
of REV, interleaved with this one, so the two are measured under the same conditions.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

from scratch import scratch_storage

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
READY = re.compile(r"ready in (\d+\.\d+) s")


def emit(**figures: object) -> None:
    print(json.dumps(figures), flush=True)


def wall(command: list[str], env: dict[str, str] | None = None,
         cwd: str = ROOT) -> tuple[float, str]:
    started = time.perf_counter()
    out = subprocess.run(command, capture_output=True, text=True, cwd=cwd, timeout=300,
                         env={**os.environ, **(env or {})})
    took = time.perf_counter() - started
    if out.returncode != 0:
        sys.exit(f"failed: {' '.join(command)}\n{out.stdout}\n{out.stderr}")
    return took, out.stdout + out.stderr


def interleaved(cases: dict[str, Callable[[], float]], repeat: int) -> dict[str, float]:
    """Each case once per round, the order rotating, then the median of each."""
    samples: dict[str, list[float]] = {name: [] for name in cases}
    names = list(cases)
    for round_ in range(repeat):
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:
            samples[name].append(cases[name]())
    return {name: statistics.median(values) for name, values in samples.items()}


def imports(repeat: int) -> None:
    py = sys.executable
    cases = {module: (lambda m=module: wall([py, "-c", f"import {m}"])[0])
             for module in ("hpckit", "hpckit.torch", "torch")}
    cases["python"] = lambda: wall([py, "-c", "pass"])[0]
    emit(figure="import_s", **{k: round(v, 3) for k, v in interleaved(cases, repeat).items()})


def linear(storage: str, checkout: str, tag: str) -> Callable[[], float]:
    """One run of the example from ``checkout`` in a fresh experiment; its wall time, with
    its logged "ready in" kept aside."""
    counter = iter(range(10**6))

    def once() -> float:
        name = f"{tag}-{next(counter)}"
        took, output = wall([sys.executable, os.path.join(checkout, "examples", "linear.py"),
                             "--workers", "2", "--epochs", "1", "--storage", storage,
                             "--name", name], env={"PYTHONPATH": checkout}, cwd=checkout)
        found = READY.search(output)
        if found:
            READY_SEEN.setdefault(tag, []).append(float(found.group(1)))
        return took

    return once


READY_SEEN: dict[str, list[float]] = {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--before", default=None, help="a git revision to compare with")
    args = parser.parse_args()
    imports(args.repeat)
    with scratch_storage(None, "hpckit-startup-") as storage, \
            tempfile.TemporaryDirectory(prefix="hpckit-before-") as before:
        cases = {"this checkout": linear(storage, ROOT, "now")}
        if args.before:
            subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", before, args.before],
                           check=True, capture_output=True)
            cases[args.before] = linear(storage, before, "before")
        try:
            walls = interleaved(cases, args.repeat)
        finally:
            if args.before:
                subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", before],
                               capture_output=True)
    for name, seconds in walls.items():
        tag = "now" if name == "this checkout" else "before"
        ready = READY_SEEN.get(tag)
        emit(figure="linear_example_2_ranks_1_epoch", code=name, wall_s=round(seconds, 2),
             logged_ready_in_s=round(statistics.median(ready), 2) if ready else None)


if __name__ == "__main__":
    main()

"""How fast this machine runs what the test suite runs most: a yardstick for the suite's time.

    python benchmarks/calibrate.py [--repeat 3]          # about a minute on 2 cores

The suite mostly waits for processes that start Python, import torch and hpckit, start MPI
ranks and train a little. This runs three such things ``--repeat`` times each and keeps the
fastest run's wall time (``_s``) and the CPU time its processes used (``_cpu_s``, user and
system, every process it started included):

- ``import``: ``python -c "import torch, hpckit.torch"``, a rank's imports;
- ``mpiexec``: ``mpiexec -n 2`` of two ranks that start MPI and meet once;
- ``linear``: ``python examples/linear.py --workers 2 --epochs 2`` into a new directory,
  a whole small run: hpckit starts two ranks, which train and commit two checkpoints.

``linear_cpu_s`` is the figure to compare: CPU time hardly changes with what else the
machine runs, where wall time does. docs/development.md gives the suite's time beside this
figure on the machine that ran it; on a machine of as many cores whose ``linear_cpu_s`` is
half again as large, expect the suite to take about half again as long. One JSON line; record
it with ``python benchmarks/record.py benchmarks/calibrate.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

from scratch import scratch_storage

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)
# Bytecode as the suite's processes have it (tests/conftest.py): written, to one cache.
ENV = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}
ENV.setdefault("PYTHONPYCACHEPREFIX",
               os.path.join(tempfile.gettempdir(), f"hpckit-tests-pycache-{os.getuid()}"))


def fastest(command: list[str], repeat: int) -> tuple[float, float]:
    """The wall time and the CPU time (of every process it started) of the fastest of
    ``repeat`` runs of ``command``, which must succeed."""
    runs = []
    for _ in range(repeat):
        before, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        out = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=ENV,
                             timeout=300)
        wall = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if out.returncode != 0:
            sys.exit(f"{' '.join(command)} exited {out.returncode}:\n{out.stdout}{out.stderr}")
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        runs.append((round(wall, 2), round(cpu, 2)))
    return min(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs of each; the fastest counts")
    args = parser.parse_args()
    python = sys.executable
    figures: dict[str, float] = {}
    commands = {
        "import": [python, "-c", "import torch, hpckit.torch"],
        "mpiexec": [os.path.join(BIN, "mpiexec"), "-n", "2", python, "-c",
                    "from mpi4py import MPI; MPI.COMM_WORLD.Barrier()"],
    }
    for name, command in commands.items():
        figures[f"{name}_s"], figures[f"{name}_cpu_s"] = fastest(command, args.repeat)
    runs = []
    for _ in range(args.repeat):
        with scratch_storage(None, "hpckit-calibrate-") as storage:
            runs.append(fastest([python, "examples/linear.py", "--workers", "2", "--epochs", "2",
                                 "--storage", storage], 1))
    figures["linear_s"], figures["linear_cpu_s"] = min(runs)
    print(json.dumps({"benchmark": "calibrate", "repeat": args.repeat, **figures}), flush=True)


if __name__ == "__main__":
    main()

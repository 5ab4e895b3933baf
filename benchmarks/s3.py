"""S3 benchmark: checkpoints to a SeaweedFS server started here on loopback.

    python benchmarks/s3.py [--quick]

For a 64 MiB and a 1 GiB checkpoint: a plain pyarrow single-stream upload of the same bytes
to the same server (the baseline, in a process of its own), then ``report()`` from 1 rank
holding the whole checkpoint and from 2 and 4 ranks holding an equal share each. Repetitions alternate
between the baseline and hpckit. Prints JSON lines: seconds (median), MiB/s, the ratio of
hpckit's throughput to the baseline's (target >= 0.8 for one rank, > 1 for several), and the
peak RSS of each process during the uploads.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # the same server the test suite starts
from support import s3_server  # noqa: E402

MPIEXEC = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or "mpiexec"

PLAIN = r"""
import json, resource, sys, time
import pyarrow.fs
fs = pyarrow.fs.S3FileSystem(access_key=sys.argv[1], secret_key=sys.argv[2],
                             endpoint_override=sys.argv[3], scheme="http")
start_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
with open(sys.argv[4], "rb") as src, fs.open_output_stream(sys.argv[5]) as out:
    while chunk := src.read(8 << 20):
        out.write(chunk)
print(json.dumps({"seconds": time.perf_counter() - t, "start_rss_mib": start_rss / 1024,
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

REPORT = r"""
import json, os, resource, sys, tempfile, time
import hpckit
from mpi4py import MPI
from hpckit import Checkpoint, CheckpointConfig, DataParallelTrainer, RunConfig, ScalingConfig

def loop(config):
    comm = MPI.COMM_WORLD
    rank = comm.rank
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, f"shard-{rank}.bin"), "wb") as f:
            for _ in range(config["bytes"] // comm.size // (8 << 20) or 1):
                f.write(os.urandom(min(8 << 20, config["bytes"] // comm.size)))
        start_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        comm.Barrier()
        t = time.perf_counter()
        hpckit.report({"x": 1}, checkpoint=Checkpoint.from_directory(d))
        seconds = time.perf_counter() - t
    peaks = comm.gather((start_rss / 1024, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024))
    if rank == 0:
        print("BENCH " + json.dumps({"seconds": seconds, "rss_mib": peaks}), flush=True)

DataParallelTrainer(loop, train_loop_config={"bytes": int(sys.argv[2])},
                    scaling_config=ScalingConfig(num_workers=MPI.COMM_WORLD.size),
                    run_config=RunConfig(name=sys.argv[3], storage_path=sys.argv[1],
                                         checkpoint_config=CheckpointConfig(num_to_keep=1))).fit()
"""


def emit(**figures: object) -> None:
    print(json.dumps(figures), flush=True)


def plain_upload(server: s3_server.S3Server, source: str, key: str) -> dict:
    out = subprocess.run([sys.executable, "-c", PLAIN, s3_server.ACCESS_KEY, s3_server.SECRET_KEY,
                          server.endpoint, source, f"{s3_server.BUCKET}/{key}"],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def hpckit_report(server: s3_server.S3Server, ranks: int, size: int, name: str) -> dict:
    out = subprocess.run([MPIEXEC, "-n", str(ranks), sys.executable, "-c", REPORT,
                          server.uri("bench"), str(size), name], capture_output=True, text=True,
                         env={**os.environ, "HPCKIT_LOG_LEVEL": "WARNING"})
    if out.returncode != 0:
        sys.exit(f"hpckit run failed:\n{out.stdout}\n{out.stderr}")
    line = next(l for l in out.stdout.splitlines() if "BENCH " in l)
    return json.loads(line.split("BENCH ", 1)[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="64 MiB only")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hpckit-s3-bench-"))
    server = s3_server.start(work / "server")
    try:
        for mib in [64] if args.quick else [64, 1024]:
            size = mib << 20
            source = work / f"{mib}.bin"
            with open(source, "wb") as f:
                for _ in range(max(1, mib // 8)):
                    f.write(os.urandom(min(8 << 20, size)))
            plain, runs = [], {1: [], 2: [], 4: []}
            for rep in range(args.reps):
                plain.append(plain_upload(server, str(source), f"plain/{mib}-{rep}.bin"))
                for ranks in runs:
                    runs[ranks].append(hpckit_report(server, ranks, size, f"r{ranks}-{mib}-{rep}"))
            base = statistics.median(p["seconds"] for p in plain)
            emit(figure="s3_plain_pyarrow_upload", mib=mib, reps=args.reps, median_s=round(base, 3),
                 mib_per_s=round(mib / base, 1),
                 peak_rss_mib=round(max(p["peak_rss_mib"] for p in plain)),
                 rss_before_mib=round(min(p["start_rss_mib"] for p in plain)))
            for ranks, results in runs.items():
                median = statistics.median(r["seconds"] for r in results)
                emit(figure="s3_report_checkpoint", mib=mib, ranks=ranks, reps=args.reps,
                     median_s=round(median, 3), mib_per_s=round(mib / median, 1),
                     throughput_vs_plain=round(base / median, 2),
                     target=">= 0.8" if ranks == 1 else "> 1",
                     peak_rss_mib_per_rank=round(max(p for r in results for _, p in r["rss_mib"])),
                     rss_before_report_mib=round(max(s for r in results for s, _ in r["rss_mib"])))
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

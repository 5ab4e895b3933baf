"""What rank 0 does per ``report()`` as the ranks grow: its MPI calls and bytes, counted.

    python benchmarks/scale.py [--ranks 2,8,32,64,128] [--reports 40] [--checkpoints 10]
                               [--ranks-per-node N]

For each rank count, ``mpiexec -n N`` (oversubscribed beyond the cores) runs one fit() whose
training function makes ``--reports`` metrics-only reports, then ``--checkpoints`` reports
with a checkpoint of two 1 KiB files per rank, and, in the same run, the same values moved
by hand on MPI's blocking collectives (every rank's announcement gathered to rank 0, rank 0's
answer broadcast: ``comm.gather`` and ``comm.bcast``), the baseline. Rank 0 counts the
collectives hpckit's steps start and the bytes it passes to them
(:func:`hpckit.run.mpi.waiting.traffic`; polls such as Test and Iprobe are not calls).

One JSON line per rank count and kind of report: calls and bytes per report on rank 0, the
median milliseconds per report and the baseline's. Timings of oversubscribed ranks on a
small machine say little; the counts hold on any machine. With ``--ranks-per-node N`` each
run of N ranks stands for a node (``HPCKIT_RANKS_PER_NODE``), so that the steps gather
through the node leaders as on several nodes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.abspath(__file__)
MPIEXEC = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or "mpiexec"
FILE_BYTES = 1024


def _timed(reports: int, one: object) -> list[float]:
    took = []
    for index in range(reports):
        before = time.perf_counter()
        one(index)  # type: ignore[operator]
        took.append(time.perf_counter() - before)
    return took


def _report(index: int, rank: int, with_checkpoint: bool) -> None:
    import hpckit
    from hpckit import Checkpoint

    if not with_checkpoint:
        hpckit.report({"loss": 1.0 / (index + 1)})
        return
    with tempfile.TemporaryDirectory(prefix="scale-") as folder:
        for name in ("model", "optimizer"):
            with open(os.path.join(folder, f"{name}-rank{rank}.bin"), "wb") as f:
                f.write(os.urandom(FILE_BYTES))
        hpckit.report({"loss": 1.0 / (index + 1)}, checkpoint=Checkpoint.from_directory(folder))


def train(config: dict) -> None:
    import hpckit
    from hpckit.run.mpi.waiting import traffic

    rank = hpckit.get_context().get_world_rank()
    figures = {}
    for kind, count in (("metrics", config["reports"]), ("checkpoint", config["checkpoints"])):
        before = traffic()
        took = _timed(count, lambda i, saving=kind == "checkpoint": _report(i, rank, saving))
        counted = traffic() - before
        figures[kind] = {"calls": counted.calls / count, "sent": counted.sent / count,
                         "ms": 1000 * statistics.median(took)}
    figures["baseline_ms"] = 1000 * statistics.median(_by_hand(config["reports"]))
    if rank == 0:
        with open(config["out"], "w") as out:
            json.dump(figures, out)


def _by_hand(reports: int) -> list[float]:
    """A metrics-only report's one step (every rank's announcement to rank 0, its plan back)
    on blocking collectives."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD

    def one(index: int) -> None:
        comm.bcast(comm.gather({"kind": "report", "count": index, "metrics": {"loss": 1.0}}))
    return _timed(reports, one)


def worker(args: argparse.Namespace) -> None:
    from hpckit import DataParallelTrainer, RunConfig, ScalingConfig
    from hpckit.config import CheckpointConfig

    config = {"reports": args.reports, "checkpoints": args.checkpoints,
              "out": os.path.join(args.storage, f"{args.name}.json")}
    DataParallelTrainer(train, train_loop_config=config,
                        scaling_config=ScalingConfig(num_workers=args.ranks),
                        run_config=RunConfig(name=args.name, storage_path=args.storage,
                                             checkpoint_config=CheckpointConfig(num_to_keep=2))
                        ).fit()


def one_run(args: argparse.Namespace, ranks: int, storage: str) -> dict:
    name = f"scale-{ranks}-{time.time_ns()}"
    command = [MPIEXEC, "-n", str(ranks), sys.executable, HERE, "--worker", "--storage", storage,
               "--ranks", str(ranks), "--reports", str(args.reports), "--checkpoints",
               str(args.checkpoints), "--name", name]
    out = subprocess.run(command, capture_output=True, text=True, timeout=1800,
                         env={**os.environ, "HPCKIT_LOG_LEVEL": "WARNING",
                              "HPCKIT_TENSORBOARD": "0",
                              "HPCKIT_RANKS_PER_NODE": str(args.ranks_per_node or "")})
    if out.returncode != 0:
        sys.exit(f"failed: {' '.join(command)}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    with open(os.path.join(storage, f"{name}.json")) as f:
        figures: dict = json.load(f)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="2,8,32,64,128",
                        type=lambda text: [int(n) for n in text.split(",")])
    parser.add_argument("--reports", type=int, default=40)
    parser.add_argument("--checkpoints", type=int, default=10)
    parser.add_argument("--storage", default=None)
    parser.add_argument("--ranks-per-node", type=int, default=0,
                        help="runs of this many ranks stand for nodes (0: MPI's own nodes)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--name", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        args.ranks = args.ranks[0]
        return worker(args)
    storage = args.storage or tempfile.mkdtemp(prefix="hpckit-scale-")
    by_ranks = {ranks: one_run(args, ranks, storage) for ranks in args.ranks}
    for ranks, figures in by_ranks.items():
        for kind in ("metrics", "checkpoint"):
            print(json.dumps({"benchmark": "scale", "ranks": ranks, "report": kind,
                              "ranks_per_node": args.ranks_per_node or None,
                              "rank0_calls_per_report": round(figures[kind]["calls"], 2),
                              "rank0_bytes_per_report": round(figures[kind]["sent"]),
                              "ms_per_report": round(figures[kind]["ms"], 3),
                              "blocking_collectives_ms": round(figures["baseline_ms"], 3)}),
                  flush=True)
    if {8, 32, 64} <= set(by_ranks):
        print(json.dumps(goals(by_ranks)), flush=True)
    if args.storage is None:
        shutil.rmtree(storage, ignore_errors=True)


def goals(by_ranks: dict[int, dict]) -> dict:
    """The issue's goals: rank 0's calls per report at 64 ranks at most 1.5 x those at 8, and
    the bytes it sends per checkpoint report at 64 ranks at most 2.3 x those at 32."""
    calls = {kind: by_ranks[64][kind]["calls"] / by_ranks[8][kind]["calls"]
             for kind in ("metrics", "checkpoint")}
    sent = by_ranks[64]["checkpoint"]["sent"] / by_ranks[32]["checkpoint"]["sent"]
    return {"benchmark": "scale", "summary": True,
            "calls_64_over_8_metrics": round(calls["metrics"], 2),
            "calls_64_over_8_checkpoint": round(calls["checkpoint"], 2),
            "calls_target": 1.5, "calls_met": max(calls.values()) <= 1.5,
            "bytes_64_over_32_checkpoint": round(sent, 2), "bytes_target": 2.3,
            "bytes_met": sent <= 2.3}


if __name__ == "__main__":
    main()

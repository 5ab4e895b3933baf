"""Multi-level checkpoints: how long report() blocks, and what a whole job pays, with the
cache on /dev/shm and on a local disk, beside storage_path alone; and a model of a 1,000-node
job. JSON lines, every figure beside its baseline measured in the same run, medians of
interleaved repetitions.

    python benchmarks/multilevel.py [--storage DIR] [--disk-cache DIR] [--quick] [--out FILE]

Each job runs ``--ranks`` ranks (default 2) of this file's rank side: every report hands a
shard of ``--mib`` MiB per rank, after ``--compute`` seconds of "training" (a sleep). The
cached variants use ``persist_every=4`` (a quarter of the checkpoints also go to storage_path,
and the last one at the end). On one machine the partner copy has no second node to go to,
so ``redundancy`` is off; the model prices it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from lines import emit, write_to
from scratch import scratch_storage

HERE = os.path.abspath(__file__)
MPIEXEC = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or "mpiexec"
ENV = {**os.environ, "HPCKIT_LOG_LEVEL": "WARNING", "HPCKIT_TENSORBOARD": "0"}
PERSIST_EVERY = 4


def rank_side(args: argparse.Namespace) -> None:
    import hpckit
    from hpckit import Checkpoint, CheckpointConfig, DataParallelTrainer, RunConfig, ScalingConfig

    def train(config: dict) -> None:
        from mpi4py import MPI

        rank = hpckit.get_context().get_world_rank()
        payload = os.urandom(config["mib"] << 20)
        blocked, started = [], time.perf_counter()
        for step in range(config["reports"]):
            time.sleep(config["compute"])
            if config["variant"] == "none":
                hpckit.report({"step": step})
                continue
            with tempfile.TemporaryDirectory(dir=config["user_dir"]) as d:
                with open(os.path.join(d, f"shard-{rank}.bin"), "wb") as f:
                    f.write(payload)
                began = time.perf_counter()
                hpckit.report({"step": step}, checkpoint=Checkpoint.from_directory(d))
                blocked.append(time.perf_counter() - began)
        every = MPI.COMM_WORLD.gather(blocked)
        if rank == 0:
            slowest = [max(times) for times in zip(*every, strict=True)]
            print("BENCH " + json.dumps({"blocked": slowest, "loop_s": time.perf_counter() - started}),
                  flush=True)

    cache = {"storage": None, "shm": args.shm_cache, "disk": args.disk_cache}.get(args.variant)
    config = CheckpointConfig(num_to_keep=2, cache_dir=cache,
                              persist_every=PERSIST_EVERY if cache else 1)
    DataParallelTrainer(train, train_loop_config={
        "mib": args.mib, "reports": args.reports, "compute": args.compute,
        "variant": args.variant, "user_dir": args.user_dir},
        scaling_config=ScalingConfig(num_workers=args.ranks),
        run_config=RunConfig(name=args.name, storage_path=args.storage,
                             checkpoint_config=config)).fit()


def one_job(args: argparse.Namespace, variant: str, rep: int) -> tuple[dict, float]:
    name = f"{variant}-{rep}-{os.getpid()}"
    command = [MPIEXEC, "-n", str(args.ranks), sys.executable, HERE, "--rank-side", variant,
               "--storage", args.storage, "--name", name, "--mib", str(args.mib),
               "--reports", str(args.reports), "--compute", str(args.compute),
               "--ranks", str(args.ranks), "--shm-cache", args.shm_cache,
               "--disk-cache", args.disk_cache, "--user-dir", args.user_dir]
    began = time.perf_counter()
    out = subprocess.run(command, capture_output=True, text=True, timeout=1200, env=ENV)
    wall = time.perf_counter() - began
    shutil.rmtree(os.path.join(args.storage, name), ignore_errors=True)
    for cache in (args.shm_cache, args.disk_cache):
        shutil.rmtree(cache, ignore_errors=True)
    if out.returncode != 0:
        sys.exit(f"benchmark command failed: {' '.join(command)}\n{out.stdout}\n{out.stderr}")
    (line,) = [json.loads(t.split("BENCH ", 1)[1]) for t in out.stdout.splitlines() if "BENCH " in t]
    return line, wall


def measure(args: argparse.Namespace) -> None:
    variants = ("none", "storage", "shm", "disk")
    blocked: dict[str, dict[str, list[float]]] = {v: {"cached": [], "stored": []} for v in variants}
    walls: dict[str, list[float]] = {v: [] for v in variants}
    for rep in range(args.reps):
        for variant in variants[rep % 4:] + variants[:rep % 4]:
            line, wall = one_job(args, variant, rep)
            walls[variant].append(wall)
            for step, seconds in enumerate(line["blocked"]):
                stored = variant == "storage" or (step + 1) % PERSIST_EVERY == 0
                blocked[variant]["stored" if stored else "cached"].append(seconds)
    med = {v: {k: round(statistics.median(s) * 1e3, 2) for k, s in kinds.items() if s}
           for v, kinds in blocked.items()}
    emit(figure="multilevel_blocking", ranks=args.ranks, mib_per_rank=args.mib,
         reports=args.reports, reps=args.reps,
         description="time report() blocks per checkpoint, slowest rank, median over interleaved "
         "jobs: storage = storage_path only; shm / disk = cache_dir on /dev/shm / on a local-disk "
         f"directory with persist_every={PERSIST_EVERY}; cached = reports that went to the cache "
         "only, stored = those that also went to storage_path",
         report_ms=med, baseline="storage_path only (storage)",
         baseline_report_ms=med["storage"].get("stored"),
         storage_same_filesystem_as_disk_cache=os.stat(args.storage).st_dev ==
         os.stat(os.path.dirname(args.disk_cache)).st_dev)
    base = statistics.median(walls["none"])
    emit(figure="multilevel_job_overhead", ranks=args.ranks, mib_per_rank=args.mib,
         reports=args.reports, compute_s=args.compute, reps=args.reps,
         description="whole-job wall time (mpiexec to exit, the final drain included) over the "
         "same job reporting the same metrics without checkpoints",
         whole_job_s={v: round(statistics.median(w), 3) for v, w in walls.items()},
         baseline="no checkpoints (none)", baseline_whole_job_s=round(base, 3),
         ratio={v: round(statistics.median(walls[v]) / base, 3) for v in variants[1:]})


def model(nodes: int = 1000, gib_per_node: float = 8.0, pfs_gib_s: float = 500.0,
          nvme_gib_s: float = 3.0, net_gib_s: float = 12.0, node_mtbf_h: float = 5 * 8760,
          persist_every: int = 10) -> None:
    """The levels of a large job on paper: what each costs, the drain rate it needs, and the
    work lost per failure at Young/Daly's interval."""
    mtbf = node_mtbf_h * 3600 / nodes
    pfs_cost = nodes * gib_per_node / pfs_gib_s
    cache_cost = gib_per_node / nvme_gib_s
    partner_copy = gib_per_node / min(net_gib_s, nvme_gib_s)
    rows = {}
    for level, cost in (("storage_path", pfs_cost), ("cache+partner", cache_cost)):
        interval = math.sqrt(2 * cost * mtbf)
        rows[level] = {"blocking_s": round(cost, 1), "young_daly_interval_s": round(interval),
                       "lost_per_failure_s": round(interval / 2 + cost),
                       "overhead_fraction": round(cost / interval, 4)}
    interval = rows["cache+partner"]["young_daly_interval_s"]
    drain = nodes * gib_per_node / (persist_every * interval)
    emit(figure="multilevel_model", nodes=nodes, checkpoint_gib_per_node=gib_per_node,
         assumptions={"pfs_aggregate_gib_s": pfs_gib_s, "nvme_write_gib_s_per_node": nvme_gib_s,
                      "network_gib_s_per_node": net_gib_s, "node_mtbf_hours": node_mtbf_h,
                      "job_mtbf_s": round(mtbf), "persist_every": persist_every,
                      "partner_copy": "over the network onto the partner's NVMe, at "
                                      "min(network, NVMe), in the background: it blocks nothing "
                                      "while it ends before the next checkpoint; the cache "
                                      "write itself blocks, at NVMe speed"},
         partner_copy_background_s=round(partner_copy, 1),
         levels=rows, drain_gib_s_needed=round(drain, 1),
         drain_fraction_of_pfs=round(drain / pfs_gib_s, 3),
         description="blocking cost per checkpoint, Young/Daly interval sqrt(2*C*MTBF), expected "
         "work lost per failure (interval/2 + C) and the storage bandwidth the drain needs for "
         "every persist_every-th cached checkpoint to reach storage_path between two of them")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rank-side", default=None, help=argparse.SUPPRESS)
    p.add_argument("--storage", default=None)
    p.add_argument("--disk-cache", default=None)
    p.add_argument("--shm-cache", default=f"/dev/shm/hpckit-bench-{os.getpid()}")
    p.add_argument("--user-dir", default=tempfile.gettempdir())
    p.add_argument("--name", default="bench")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--mib", type=int, default=64)
    p.add_argument("--reports", type=int, default=12)
    p.add_argument("--compute", type=float, default=0.2)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    if args.rank_side:
        args.variant = args.rank_side
        rank_side(args)
        return
    write_to(args.out)
    if args.quick:
        args.mib, args.reps, args.reports = 8, 2, 8
    model()
    with scratch_storage(args.storage, "hpckit-bench-multilevel-") as storage:
        args.storage = storage
        args.disk_cache = args.disk_cache or os.path.join(tempfile.gettempdir(),
                                                          f"hpckit-bench-cache-{os.getpid()}")
        measure(args)


if __name__ == "__main__":
    main()

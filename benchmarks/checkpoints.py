"""Checkpoint benchmarks: JSON lines, each figure beside a baseline measured in the same run.

    python benchmarks/checkpoints.py [--storage DIR] [--quick] [--only FIGURES] [--out FILE]

Figures (2 ranks unless said): how long report() blocks per checkpoint in each upload mode
(beside a sync report() and a raw write+fsync of the same bytes); the whole-job overhead of a
checkpoint each epoch, sync and async (beside the same job without checkpoints); write-in-place
persist throughput (beside Python writing and fsyncing the same bytes); the latency of a tiny
sync checkpoint and the manifest's size from 2 to 32 ranks (beside report() without one); and
hpckit's DCP save (beside torch's own dcp.save / async_save). Every figure is a median of
interleaved repetitions; ``--quick`` skips the 1 GiB cases and 32 ranks and repeats less.
Rank-side loops are in benchmarks/checkpoint_ranks.py.
"""

from __future__ import annotations

import argparse
import itertools
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

HERE = os.path.dirname(os.path.abspath(__file__))
RANKS = os.path.join(HERE, "checkpoint_ranks.py")
MPIEXEC = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or "mpiexec"
ENV = {**os.environ, "HPCKIT_LOG_LEVEL": "WARNING", "HPCKIT_TENSORBOARD": "0"}
_names = itertools.count()


def med(values: list[float], scale: float = 1e3) -> float:
    """The median in milliseconds (``scale`` 1 for seconds), rounded for the report."""
    return round(statistics.median(values) * scale, 3)


def run_ranks(n: int, mode: str, storage: str, *args: str, timeout: float = 1200,
              env: dict[str, str] | None = None) -> tuple[dict, float]:
    """``mpiexec -n n checkpoint_ranks.py mode``: its one BENCH line and the job's wall time; the
    experiment is removed afterwards (disk space)."""
    name = f"{mode}-{n}-{next(_names)}-{os.getpid()}"
    command = [MPIEXEC, "-n", str(n), sys.executable, RANKS, mode, "--storage", storage, "--name", name,
               *args]
    started = time.perf_counter()
    out = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                         env={**ENV, **(env or {})})
    wall = time.perf_counter() - started
    shutil.rmtree(os.path.join(storage, name), ignore_errors=True)
    if out.returncode != 0:
        sys.exit(f"benchmark command failed: {' '.join(command)}\n{out.stdout}\n{out.stderr}")
    (line,) = [json.loads(t.split("BENCH ", 1)[1]) for t in out.stdout.splitlines() if "BENCH " in t]
    return line, wall


def report_blocking(storage: str, mib: int, reps: int, sleep: float, block: int) -> None:
    """Figures 1 and 3 from one interleaved run of the five variants."""
    user_dir = tempfile.gettempdir()
    line, _ = run_ranks(2, "blocking", storage, "--mib", str(mib), "--reps", str(reps),
                        "--sleep", str(sleep), "--user-dir", user_dir, "--block", str(block))
    s = line["samples"]
    modes = ("sync", "async", "in_place", "in_place_async")
    target = 10.0 if mib <= 64 else 50.0
    worst_async = max(med(s["async_report"]), med(s["in_place_async_report"]))
    emit(figure="report_blocking", ranks=2, mib=mib, reps=reps, checkpoints_per_block=block,
         samples=len(s["async_report"]), sleep_between_reports_s=sleep,
         description=f"time report() blocks per checkpoint of {mib} MiB in all ({mib // 2} MiB of random "
         "bytes per rank, one file each), slowest rank, median over interleaved blocks of checkpoints in "
         "one mode (the first of each block untimed: an async report() then commits the previous "
         "async checkpoint, as in training); sync and "
         "async hand a directory the user wrote with numpy tofile (async moves it into staging, a "
         "rename where it is on the storage's filesystem); in_place wrote into get_checkpoint_dir() "
         "and reports with NO_UPLOAD (hash+fsync) or ASYNC; the user's own write is not included "
         "(a barrier follows it)",
         report_ms={m: med(s[f"{m}_report"]) for m in modes},
         report_max_ms={m: round(max(s[f"{m}_report"]) * 1e3, 3) for m in modes},
         user_write_ms={m: med(s[f"{m}_write"]) for m in modes},
         user_dir_same_filesystem_as_storage=os.stat(user_dir).st_dev == os.stat(storage).st_dev,
         baseline="sync report() of the same files; raw python write+fsync of the same bytes",
         baseline_sync_report_ms=med(s["sync_report"]), baseline_raw_write_fsync_ms=med(s["raw_write"]),
         target_async_ms=target, target_met=worst_async <= target)
    raw, in_place = statistics.median(s["raw_total"]), statistics.median(s["in_place_total"])
    emit(figure="persist_throughput", ranks=2, mib=mib, samples=len(s["raw_total"]),
         description="write in place: each rank writes its share with numpy tofile into "
         "get_checkpoint_dir(), then report(NO_UPLOAD) hashes and fsyncs it and commits; timed "
         "from a barrier before the writes to the end of report() on the slowest rank. Baseline: "
         "each rank writes the same bytes with Python (file write, fsync of file and directory) "
         "into a directory of the experiment, barrier to barrier. ratio = in-place throughput / "
         "raw throughput (1.0: persisting costs nothing beyond the write itself)",
         in_place_s=round(in_place, 4), in_place_mib_per_s=round(mib / in_place, 1),
         in_place_report_ms=med(s["in_place_report"]), in_place_write_ms=med(s["in_place_write"]),
         baseline="python write+fsync of the same bytes, same filesystem, interleaved",
         baseline_s=round(raw, 4), baseline_mib_per_s=round(mib / raw, 1),
         throughput_ratio=round(raw / in_place, 3), target_ratio=0.9, target_met=raw / in_place >= 0.9)


def job_overhead(storage: str, reps: int) -> None:
    """Figure 2: whole jobs, the three variants interleaved (rotating order)."""
    variants = ("none", "sync", "async")
    walls: dict[str, list[float]] = {v: [] for v in variants}
    loops: dict[str, list[float]] = {v: [] for v in variants}
    blocked: dict[str, list[float]] = {v: [] for v in variants}
    saved: dict[str, list[float]] = {v: [] for v in variants}
    for rep in range(reps):
        for v in variants[rep % 3:] + variants[:rep % 3]:
            line, wall = run_ranks(2, "job", storage, "--checkpoints", v)
            walls[v].append(wall)
            loops[v].append(line["loop_s"])
            blocked[v].extend(line["blocked_s"])
            saved[v].extend(line["torch_save_s"])
    base_wall, base_loop = statistics.median(walls["none"]), statistics.median(loops["none"])
    ratio = {v: round(statistics.median(walls[v]) / base_wall, 3) for v in ("sync", "async")}
    emit(figure="job_overhead", ranks=2, reps=reps,
         description="benchmarks/workload.py's Ray comparison workload (64 MiB model, 10 epochs of 4 "
         "steps, DDP over Gloo, top-2 by loss) launched with mpiexec -n 2; rank 0 torch.saves the "
         "model each epoch and report()s it sync or async; ratio = job wall time / the same job "
         "reporting the same metrics without a checkpoint; loop = the training function alone; "
         "torch_save: rank 0's own serialisation, in the training thread, part of the overhead",
         whole_job_s={v: round(statistics.median(walls[v]), 3) for v in variants},
         training_loop_s={v: round(statistics.median(loops[v]), 3) for v in variants},
         blocked_per_report_ms={v: med(blocked[v]) for v in variants},
         torch_save_per_epoch_ms={v: med(saved[v] or [0.0]) for v in variants},
         baseline="the same job without checkpoints (none)", baseline_whole_job_s=round(base_wall, 3),
         ratio=ratio,
         loop_ratio={v: round(statistics.median(loops[v]) / base_loop, 3) for v in ("sync", "async")},
         target_async_ratio=1.03, target_met=ratio["async"] <= 1.03)


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of log(y) over log(x): the growth exponent."""
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = statistics.fmean(lx), statistics.fmean(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True)) / sum((a - mx) ** 2 for a in lx)


def commit_latency(storage: str, counts: tuple[int, ...], reps: int) -> None:
    """Figure 4: one run per rank count, the two report kinds interleaved inside it."""
    rows = []
    for n in counts:
        line, _ = run_ranks(n, "commit", storage, "--reps", str(reps))
        s = line["samples"]
        rows.append({"ranks": n, "median_ms": med(s["checkpoint"]),
                     "baseline_no_checkpoint_median_ms": med(s["no_checkpoint"]),
                     "manifest_bytes": line["manifest_bytes"]})
    ranks = [r["ranks"] for r in rows]
    exponent = slope(ranks, [r["median_ms"] for r in rows])
    emit(figure="commit_latency", reps=reps, cpu_cores=os.cpu_count(),
         description="latency of a sync report() whose checkpoint holds one 4 KiB file per rank "
         "(slowest rank, median), and manifest.json's size after the run (num_to_keep=2), by rank "
         "count; ranks beyond the cores are oversubscribed on this machine, so the latency also "
         "grows with CPU contention; growth_exponent: least-squares slope of log latency over log "
         "ranks (1.0 = linear)",
         by_ranks=rows, baseline="report() without a checkpoint, interleaved, same run",
         growth_exponent=round(exponent, 3),
         growth_exponent_beyond_first=round(slope(ranks[1:], [r["median_ms"] for r in rows[1:]]), 3)
         if len(rows) > 2 else None,
         manifest_growth_exponent=round(slope(ranks, [r["manifest_bytes"] for r in rows]), 3),
         latency_ratio_last_over_first=round(rows[-1]["median_ms"] / rows[0]["median_ms"], 2),
         rank_ratio=ranks[-1] // ranks[0], target="growth at most linear (exponent <= 1)",
         target_met=exponent <= 1.0)


def dcp_vs_plain(storage: str, reps: int, mib: int = 64) -> None:
    """Figure 5: the four saves interleaved in one run under TorchTrainer."""
    line, _ = run_ranks(2, "dcp", storage, "--mib", str(mib), "--reps", str(reps), "--sleep", "0.3")
    s = line["samples"]
    ratios = {"sync": med(s["hpckit_sync_durable"]) / med(s["plain_sync_durable"]),
              "async_blocking": med(s["hpckit_async_blocking"]) / med(s["plain_async_blocking"]),
              "async_durable": med(s["hpckit_async_durable"]) / med(s["plain_async_durable"])}
    emit(figure="dcp_vs_plain", ranks=2, mib=mib, reps=reps,
         description=f"a {mib} MiB float32 DTensor sharded over 2 ranks (Gloo, CPU); hpckit: "
         "save_state_dcp() + report() (sync), save_state_dcp(async_=True) + report(ASYNC); plain: "
         "torch.distributed.checkpoint.save / async_save into a directory of the same experiment "
         "(FileSystemWriter fsyncs its files). blocking: until the calls return; durable: hpckit "
         "until the checkpoint is committed in the manifest (polled by report() without a "
         "checkpoint every 20 ms), plain until async_save's future is done (polled every 20 ms), "
         "slowest rank, median of interleaved repetitions",
         hpckit_ms={"sync": med(s["hpckit_sync_durable"]), "async_blocking": med(s["hpckit_async_blocking"]),
                    "async_durable": med(s["hpckit_async_durable"])},
         baseline="torch's own dcp.save / dcp.async_save, same state and filesystem",
         plain_ms={"sync": med(s["plain_sync_durable"]), "async_blocking": med(s["plain_async_blocking"]),
                   "async_durable": med(s["plain_async_durable"])},
         ratio={k: round(v, 3) for k, v in ratios.items()}, target_ratio=1.1,
         target_met={k: v <= 1.1 for k, v in ratios.items()})


def checkpoint_files(storage: str, counts: tuple[int, ...], per_node: int) -> None:
    """The files one checkpoint creates, by rank count, the ranks in nodes of ``per_node``
    (HPCKIT_RANKS_PER_NODE): each rank's own, and the ranks' resume states, one file a node
    (#66; before, one a rank)."""
    rows = []
    for n in counts:
        line, _ = run_ranks(n, "commit", storage, "--reps", "1",
                            env={"HPCKIT_RANKS_PER_NODE": str(per_node)})
        rows.append({"ranks": n, "nodes": -(-n // per_node),
                     "files_per_checkpoint": line["files_per_checkpoint"],
                     "resume_state_files": line["resume_state_files"]})
    emit(figure="checkpoint_files", ranks_per_node=per_node, by_ranks=rows,
         description="files a sync checkpoint of one 4 KiB file per rank creates, every rank "
         "keeping a resume state: the ranks' files and the resume states' (one a node)",
         target_met=all(r["resume_state_files"] == r["nodes"] for r in rows))


FIGURES = ("report_blocking", "job_overhead", "commit_latency", "checkpoint_files", "dcp")


def run_all(storage: str, quick: bool, only: tuple[str, ...] = FIGURES) -> None:
    if "report_blocking" in only:
        sizes = [(64, 5 if quick else 8, 0.5, 3)] + ([] if quick else [(1024, 4, 4.0, 2)])
        for mib, reps, sleep, block in sizes:
            report_blocking(storage, mib, reps, sleep, block)
    if "job_overhead" in only:
        job_overhead(storage, 2 if quick else 3)
    if "commit_latency" in only:
        commit_latency(storage, (2, 4, 8, 16) if quick else (2, 4, 8, 16, 32), 15 if quick else 30)
    if "checkpoint_files" in only:
        checkpoint_files(storage, (4, 8) if quick else (3, 4, 8, 16), 2)
    if "dcp" in only:
        dcp_vs_plain(storage, 4 if quick else 8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--storage", default=None, help="where checkpoints go (default: a temp dir)")
    parser.add_argument("--quick", action="store_true", help="skip 1 GiB and 32 ranks, fewer repetitions")
    parser.add_argument("--out", default=None, help="also append the JSON lines to this file")
    parser.add_argument("--only", default=",".join(FIGURES),
                        help=f"the figures to measure, comma-separated, of {', '.join(FIGURES)} "
                        "(record with --as NAME, so that the whole run's file stays)")
    args = parser.parse_args()
    only = tuple(args.only.split(","))
    if unknown := set(only) - set(FIGURES):
        parser.error(f"--only {args.only}: no figure {', '.join(sorted(unknown))}; "
                     f"choose of {', '.join(FIGURES)}")
    write_to(args.out)
    with scratch_storage(args.storage, "hpckit-ckpt-bench-") as storage:
        run_all(storage, args.quick, only)


if __name__ == "__main__":
    main()

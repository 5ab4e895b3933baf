"""Many small reports with checkpoints and top-K retention. Every rank prints one
``SOAK {json}`` line: open file descriptors and RSS early and at the end."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import numpy as np
from mpi4py import MPI

import hpckit
from hpckit import Checkpoint, CheckpointConfig, DataParallelTrainer, RunConfig, ScalingConfig


def fds() -> int:
    """The descriptors held for good: the fewest of several looks 20 ms apart, since rank 0's
    background threads (the lock's refresh, the purge, the metrics log) hold one for a moment
    now and then, while a leaked one stays in every look."""
    looks = []
    for _ in range(5):
        looks.append(len(os.listdir("/proc/self/fd")))
        time.sleep(0.02)
    return min(looks)


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def train_loop(config: dict) -> None:
    rank = hpckit.get_context().get_world_rank()
    seen: dict[str, int] = {}
    for step in range(config["reports"]):
        with tempfile.TemporaryDirectory() as d:
            np.save(os.path.join(d, f"shard-{rank}.npy"), np.full(256, step, dtype=np.float64))
            hpckit.report({"loss": 1.0 / (step + 1), "step": step},
                          checkpoint=Checkpoint.from_directory(d))
        if step == config["warmup"]:
            seen.update(fds_early=fds(), rss_early_kib=rss_kib())
    seen.update(fds_end=fds(), rss_end_kib=rss_kib(), rank=rank)
    print("SOAK " + json.dumps(seen), flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--storage", required=True)
    p.add_argument("--reports", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--keep", type=int, default=3)
    args = p.parse_args()
    DataParallelTrainer(
        train_loop, train_loop_config={"reports": args.reports, "warmup": args.warmup},
        scaling_config=ScalingConfig(num_workers=MPI.COMM_WORLD.size),
        run_config=RunConfig(name="soak", storage_path=args.storage,
                             checkpoint_config=CheckpointConfig(
                                 num_to_keep=args.keep, checkpoint_score_attribute="loss",
                                 checkpoint_score_order="min"))).fit()


if __name__ == "__main__":
    main()

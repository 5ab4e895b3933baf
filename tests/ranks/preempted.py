"""Every rank asks get_preemption_info() at each step, as a Ray program does, and prints
``INFO step {json}``. With --signal-at N, rank 1 sends itself the stop signal at step N (as
Slurm's warning would); otherwise the test sends it (scancel --signal=USR2)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import tempfile
import time

import hpckit as train
from hpckit import Checkpoint, DataParallelTrainer, FailureConfig, RunConfig, ScalingConfig


def train_loop(config: dict) -> None:
    rank = train.get_context().get_world_rank()
    for step in range(config["steps"]):
        if rank == 1 and step == config["signal_at"]:
            os.kill(os.getpid(), signal.SIGUSR2)
            time.sleep(0.1)
        info = train.get_preemption_info()
        while step >= config["poll_after"] and info is None:  # wait for the test's signal
            time.sleep(0.2)
            info = train.get_preemption_info()
        seen = None if info is None else {"deadline_ms": info.deadline_ms,
                                          "nodes": info.preempted_node_to_ranks,
                                          "ranks": info.preempted_ranks}
        print(f"INFO {step} {json.dumps(seen)} END", flush=True)
        time.sleep(config["sleep"])
        with tempfile.TemporaryDirectory() as d:
            train.report({"step": step}, checkpoint=Checkpoint.from_directory(d))


def main() -> None:
    from mpi4py import MPI  # after hpckit, which clears a killed job step's MPI memory first

    p = argparse.ArgumentParser()
    p.add_argument("--storage", required=True)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--sleep", type=float, default=0.2)
    p.add_argument("--signal-at", type=int, default=-1)
    p.add_argument("--max-preemption-failures", type=int, default=-1)
    p.add_argument("--poll-after", type=int, default=10**9,
                   help="from this step on, ask until the job is told it will end")
    args = p.parse_args()
    DataParallelTrainer(
        train_loop, train_loop_config={"steps": args.steps, "sleep": args.sleep,
                                       "signal_at": args.signal_at,
                                       "poll_after": args.poll_after},
        scaling_config=ScalingConfig(num_workers=MPI.COMM_WORLD.size),
        run_config=RunConfig(name="preempted", storage_path=args.storage,
                             failure_config=FailureConfig(
                                 max_preemption_failures=args.max_preemption_failures))).fit()


if __name__ == "__main__":
    main()

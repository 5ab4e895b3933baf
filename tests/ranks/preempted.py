"""Every rank asks get_preemption_info() at each step, as a Ray program does, and prints
``INFO step {json}``. With --signal-at N, rank 1 sends itself the stop signal at step N (as
Slurm's warning would); otherwise the test sends it (scancel --signal, or a preemption).
From --poll-after on, the ranks wait for it (rank 0 prints ``WAITING restart attempt``),
in the Slurm incarnations that --poll-restarts names. With --fail-once-at N, rank 1 raises
at step N the first time any run of this experiment gets there."""

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
    start = 0
    if checkpoint := train.get_checkpoint():
        with checkpoint.as_directory() as d, open(os.path.join(d, "step")) as f:
            start = int(f.read()) + 1
    for step in range(start, config["steps"]):
        if rank == 1 and step == config["signal_at"]:
            os.kill(os.getpid(), signal.SIGUSR2)
            time.sleep(0.1)
        fail_once(rank, step, config)
        info = train.get_preemption_info()
        if step >= config["poll_after"] and info is None and polling(config):
            if rank == 0:
                print(f"WAITING {restart()} {os.environ.get('HPCKIT_ATTEMPT', '0')} END",
                      flush=True)
            while info is None:  # wait for the test's signal
                time.sleep(0.2)
                info = train.get_preemption_info()
        seen = None if info is None else {"deadline_ms": info.deadline_ms,
                                          "nodes": info.preempted_node_to_ranks,
                                          "ranks": info.preempted_ranks}
        print(f"INFO {step} {json.dumps(seen)} END", flush=True)
        time.sleep(config["sleep"])
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "step"), "w") as f:
                f.write(str(step))
            train.report({"step": step}, checkpoint=Checkpoint.from_directory(d))


def restart() -> str:
    return os.environ.get("SLURM_RESTART_COUNT", "0")


def polling(config: dict) -> bool:
    return config["poll_restarts"] is None or restart() in config["poll_restarts"]


def fail_once(rank: int, step: int, config: dict) -> None:
    marker = os.path.join(config["storage"], "failed-once")
    if rank == 1 and step == config["fail_once_at"] and not os.path.exists(marker):
        open(marker, "w").close()
        raise RuntimeError(f"failing once at step {step} (injected by the test)")


def main() -> None:
    from mpi4py import MPI  # after hpckit, which clears a killed job step's MPI memory first

    p = argparse.ArgumentParser()
    p.add_argument("--storage", required=True)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--sleep", type=float, default=0.2)
    p.add_argument("--signal-at", type=int, default=-1)
    p.add_argument("--max-preemption-failures", type=int, default=-1)
    p.add_argument("--max-failures", type=int, default=0)
    p.add_argument("--fail-once-at", type=int, default=-1)
    p.add_argument("--poll-restarts", default=None,
                   help="comma-separated SLURM_RESTART_COUNTs that wait (default: all)")
    p.add_argument("--poll-after", type=int, default=10**9,
                   help="from this step on, ask until the job is told it will end")
    args = p.parse_args()
    DataParallelTrainer(
        train_loop, train_loop_config={"steps": args.steps, "sleep": args.sleep,
                                       "signal_at": args.signal_at,
                                       "poll_after": args.poll_after,
                                       "storage": args.storage,
                                       "fail_once_at": args.fail_once_at,
                                       "poll_restarts": args.poll_restarts and
                                       args.poll_restarts.split(",")},
        scaling_config=ScalingConfig(num_workers=MPI.COMM_WORLD.size),
        run_config=RunConfig(name="preempted", storage_path=args.storage,
                             failure_config=FailureConfig(
                                 max_failures=args.max_failures,
                                 max_preemption_failures=args.max_preemption_failures))).fit()


if __name__ == "__main__":
    main()

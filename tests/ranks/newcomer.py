"""A small run as a newcomer starts one: `python newcomer.py` (hpckit starts the ranks), or
under mpiexec. Torch only with --gpu (TorchTrainer, which checks for CUDA); otherwise
DataParallelTrainer. Every report commits a tiny checkpoint; rank 0 prints ``STEP n``."""

from __future__ import annotations

import argparse
import os
import signal
import tempfile
import time

import hpckit
from hpckit import Checkpoint, DataParallelTrainer, FailureConfig, RunConfig, ScalingConfig


def train_loop(config: dict) -> None:
    ctx = hpckit.get_context()
    rank = ctx.get_world_rank()
    start = 0
    if checkpoint := hpckit.get_checkpoint():
        with open(os.path.join(checkpoint.path, "step.txt")) as f:
            start = int(f.read()) + 1
    for step in range(start, config["steps"]):
        if config["fail"] and rank == 0:
            raise RuntimeError(f"failing at step {step} as asked")
        if config["stuck"] and rank > 0 and step == 2:
            from mpi4py import MPI

            MPI.COMM_WORLD.barrier()  # rank 0 never joins: this rank waits inside MPI
        time.sleep(config["sleep"])
        with tempfile.TemporaryDirectory() as d:
            if rank == 0:
                with open(os.path.join(d, "step.txt"), "w") as f:
                    f.write(str(step))
            hpckit.report({"step": step, "loss": 100.0 / (step + 1) ** 3},
                          checkpoint=Checkpoint.from_directory(d))
        if rank == 0:
            print(f"STEP {step}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--storage", required=True)
    p.add_argument("--name", default="newcomer")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--sleep", type=float, default=0.05)
    p.add_argument("--gpu", action="store_true", help="TorchTrainer with use_gpu=True")
    p.add_argument("--stuck", action="store_true", help="ranks > 0 wait inside MPI at step 2")
    p.add_argument("--fail", action="store_true", help="rank 0 raises at its first step")
    p.add_argument("--max-failures", type=int, default=0)
    p.add_argument("--before-fit", type=float, default=0.0, help="seconds of work before fit()")
    p.add_argument("--catch", action="store_true", help="catch KeyboardInterrupt around fit()")
    args = p.parse_args()
    time.sleep(args.before_fit)
    trainer_class = DataParallelTrainer
    if args.gpu:
        from hpckit.torch import TorchTrainer

        trainer_class = TorchTrainer
    name = os.environ.get("NEWCOMER_NAME", args.name)
    trainer = trainer_class(
        train_loop,
        train_loop_config={"steps": args.steps, "sleep": args.sleep, "stuck": args.stuck,
                           "fail": args.fail},
        scaling_config=ScalingConfig(num_workers=args.workers, use_gpu=args.gpu),
        run_config=RunConfig(name=name, storage_path=args.storage,
                             failure_config=FailureConfig(max_failures=args.max_failures)),
    )
    if not args.catch:
        trainer.fit()
        return
    try:
        trainer.fit()
    except KeyboardInterrupt:  # as a Ray program may: Ctrl-C is the program's own again
        default = signal.getsignal(signal.SIGINT) is signal.default_int_handler
        print(f"CAUGHT KeyboardInterrupt; default handler back: {default}", flush=True)


if __name__ == "__main__":
    main()

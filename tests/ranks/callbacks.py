"""A UserCallback as a Ray program writes one; rank 0 prints ``CALLS {json}`` after fit()."""

from __future__ import annotations

import argparse
import json
import os
import tempfile

import hpckit as train
from hpckit import Checkpoint, DataParallelTrainer, RunConfig, ScalingConfig, UserCallback


class Recorder(UserCallback):
    def __init__(self) -> None:
        self.calls: list[list] = []

    def after_report(self, run_context, metrics, checkpoint) -> None:
        assert run_context.get_train_loop_config() == {"mode": "mixed"}
        self.calls.append([metrics, os.path.basename(checkpoint.path) if checkpoint else None])


def train_loop(config: dict) -> None:
    rank = train.get_context().get_world_rank()
    for step, mode in enumerate(["sync", None, "async", None, "sync"]):
        metrics = {"step": step, "rank": rank}
        if mode is None:
            train.report(metrics)
            continue
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, f"r{rank}.txt"), "w") as f:
                f.write(str(step))
            train.report(metrics, checkpoint=Checkpoint.from_directory(d),
                         checkpoint_upload_mode=mode)


def main() -> None:
    from mpi4py import MPI  # after hpckit, which clears a killed job step's MPI memory first

    p = argparse.ArgumentParser()
    p.add_argument("--storage", required=True)
    args = p.parse_args()
    recorder = Recorder()
    DataParallelTrainer(train_loop, train_loop_config={"mode": "mixed"},
                        scaling_config=ScalingConfig(num_workers=MPI.COMM_WORLD.size),
                        run_config=RunConfig(name="callbacks", storage_path=args.storage,
                                             callbacks=[recorder])).fit()
    if MPI.COMM_WORLD.rank == 0:
        print("CALLS " + json.dumps(recorder.calls) + " END", flush=True)
    else:
        assert recorder.calls == [], recorder.calls  # called on rank 0 only


if __name__ == "__main__":
    main()

"""Every rank asks for all reported checkpoints after its reports and prints
``SEEN [indexes] STATUS`` (with mpiexec -prepend-rank, each line says its rank)."""

from __future__ import annotations

import argparse
import json
import os
import tempfile

import hpckit as train
from hpckit import Checkpoint, DataParallelTrainer, RunConfig, ScalingConfig


def train_loop(config: dict) -> None:
    start = 0
    if checkpoint := train.get_checkpoint():
        with open(os.path.join(checkpoint.path, "i.txt")) as f:
            start = int(f.read()) + 1
    for i in range(start, config["reports"]):
        with tempfile.TemporaryDirectory() as d:
            if train.get_context().get_world_rank() == 0:
                with open(os.path.join(d, "i.txt"), "w") as f:
                    f.write(str(i))
            train.report({"i": i}, checkpoint=Checkpoint.from_directory(d))
    reported = train.get_all_reported_checkpoints()
    indexes = [int(r.checkpoint.path.rsplit("_", 1)[1]) for r in reported]
    statuses = sorted({r.status.name for r in reported})
    print(f"SEEN {json.dumps(indexes)} {' '.join(statuses)}", flush=True)


def main() -> None:
    from mpi4py import MPI  # after hpckit, which clears a killed job step's MPI memory first

    p = argparse.ArgumentParser()
    p.add_argument("--storage", required=True)
    p.add_argument("--reports", type=int, default=3)
    args = p.parse_args()
    DataParallelTrainer(train_loop, train_loop_config={"reports": args.reports},
                        scaling_config=ScalingConfig(num_workers=MPI.COMM_WORLD.size),
                        run_config=RunConfig(name="reported", storage_path=args.storage)).fit()


if __name__ == "__main__":
    main()

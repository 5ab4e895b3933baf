"""A run that prints where its result lives, as a Ray program would use it: listing the
experiment through ``result.filesystem`` at ``result.path`` and reading a checkpoint file
through ``checkpoint.filesystem`` at ``checkpoint.path``."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import pyarrow.fs

import hpckit
from hpckit import Checkpoint, DataParallelTrainer, RunConfig, ScalingConfig


def train_loop(config: dict) -> None:
    ctx = hpckit.get_context()
    start = 0
    if checkpoint := hpckit.get_checkpoint():
        with checkpoint.as_directory() as d:
            start = int(open(os.path.join(d, "epoch.txt")).read()) + 1
    for epoch in range(start, config["epochs"]):
        with tempfile.TemporaryDirectory() as d:
            handed = None
            if ctx.get_world_rank() == 0:
                with open(os.path.join(d, "epoch.txt"), "w") as f:
                    f.write(str(epoch))
                handed = Checkpoint.from_directory(d)
            hpckit.report({"epoch": epoch}, checkpoint=handed)
    if ctx.get_world_rank() == 0:
        print("CONTEXT " + json.dumps({"experiment": ctx.get_experiment_path(),
                                       "storage": ctx.get_storage_path()}), flush=True)


def describe(result: hpckit.Result) -> dict:
    listed = result.filesystem.get_file_info(pyarrow.fs.FileSelector(result.path))
    checkpoint = result.checkpoint
    assert checkpoint is not None
    with checkpoint.filesystem.open_input_stream(f"{checkpoint.path}/epoch.txt") as f:
        epoch = f.read().decode()
    return {"path": result.path, "checkpoint": checkpoint.path, "epoch": epoch,
            "listed": sorted(i.base_name for i in listed),
            "best": [c.path for c, _ in result.best_checkpoints]}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--storage", required=True)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=2)
    args = p.parse_args()
    result = DataParallelTrainer(
        train_loop, train_loop_config={"epochs": args.epochs},
        scaling_config=ScalingConfig(num_workers=args.workers),
        run_config=RunConfig(name="paths", storage_path=args.storage)).fit()
    if int(os.environ.get("PMI_RANK", "0")) == 0:
        print("RESULT " + json.dumps(describe(result)), flush=True)


if __name__ == "__main__":
    sys.exit(main())

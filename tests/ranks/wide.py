"""Many ranks, each with state of its own: what a run at scale checkpoints and resumes.

    mpiexec -n 64 python tests/ranks/wide.py --storage DIR --epochs 4

Each rank's state is a vector that only its own rank and the epoch decide (see
:func:`expected`), saved every epoch as ``state-rank{r}.npy`` in a checkpoint that every rank
hands, with one file all ranks hand alike (``config.json``, written by rank 0 alone). A
resumed rank restores its own file; rank 0 prints ``FINAL {json}`` with every rank's state
(gathered by MPI) when training finishes, so that a test compares it with :func:`expected`.
No torch: a rank starts in a fraction of a second.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

from mpi4py import MPI  # noqa: F401  (first: the ranks start MPI together, docs/launching.md)

import numpy as np

import hpckit
from hpckit import Checkpoint, DataParallelTrainer, RunConfig, ScalingConfig

WIDTH = 4


def expected(rank: int, epochs: int) -> list[float]:
    """A rank's state after ``epochs`` epochs of :func:`step`, from its start."""
    state = start(rank)
    for epoch in range(epochs):
        state = step(state, epoch)
    return [float(v) for v in state]


def start(rank: int) -> np.ndarray:
    return np.arange(WIDTH, dtype=np.float64) + rank


def step(state: np.ndarray, epoch: int) -> np.ndarray:
    return state * 0.5 + epoch


def loop(config: dict) -> None:
    ctx = hpckit.get_context()
    rank = ctx.get_world_rank()
    name = f"state-rank{rank}.npy"
    state, first = start(rank), 0
    if checkpoint := hpckit.get_checkpoint():
        with checkpoint.as_directory() as d:
            state = np.load(os.path.join(d, name))
            with open(os.path.join(d, "config.json")) as f:
                first = json.load(f)["epoch"] + 1
    for epoch in range(first, config["epochs"]):
        state = step(state, epoch)
        with tempfile.TemporaryDirectory() as d:
            np.save(os.path.join(d, name), state)
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump({"epoch": epoch}, f)
            hpckit.report({"epoch": epoch, "mine": float(state.sum())},
                          checkpoint=Checkpoint.from_directory(d))
    from mpi4py import MPI

    states = MPI.COMM_WORLD.gather([float(v) for v in state])
    if rank == 0:
        print("FINAL " + json.dumps(states), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--storage", required=True)
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()
    DataParallelTrainer(loop, train_loop_config={"epochs": args.epochs},
                        scaling_config=ScalingConfig(
                            num_workers=int(os.environ.get("PMI_SIZE", "1"))),
                        run_config=RunConfig(name="wide", storage_path=args.storage)).fit()


if __name__ == "__main__":
    main()

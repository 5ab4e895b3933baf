"""Deterministic training: the same epochs give the same parameters, however often the run
is stopped and resumed. Rank 0 prints ``FINAL {json}`` when training finishes.

By default a NumPy linear model under ``DataParallelTrainer`` (a rank starts in a fraction of a
second: what the stop, requeue and resume tests exercise is torch-free). ``--torch`` trains
the same kind of model with ``TorchTrainer``, DDP and a DataLoader, and imports torch before
hpckit as many scripts do (the start-up hook must keep a stop signal meanwhile); its
parameters differ from NumPy's, so compare a run with a reference of the same kind."""

from __future__ import annotations

import sys

if "--torch" in sys.argv:
    import torch  # noqa: F401  (first, as in many training scripts)

import argparse
import json
import os
import socket
import tempfile
import time
from functools import partial

import numpy as np

import hpckit
from hpckit import (
    Checkpoint,
    CheckpointConfig,
    DataParallelTrainer,
    FailureConfig,
    RunConfig,
    ScalingConfig,
)

SAMPLES, FEATURES, BATCH = 256, 8, 16


def numpy_loop(config: dict) -> None:
    """Data-parallel SGD with momentum: every epoch's shuffle depends only on the epoch, each
    rank takes its share of every batch, and the gradients are averaged over the ranks."""
    from mpi4py import MPI

    data = np.random.default_rng(0)
    x = data.standard_normal((SAMPLES, FEATURES))
    y = x @ np.arange(1.0, FEATURES + 1)
    ctx = hpckit.get_context()
    rank, size = ctx.get_world_rank(), ctx.get_world_size()
    if config.get("show_hosts"):
        print(f"RANK {rank} ON {socket.gethostname()} END", flush=True)
    weights, velocity, start = np.zeros(FEATURES), np.zeros(FEATURES), 0
    name = f"state-rank{rank}.npz" if config.get("every_rank_saves") else "state.npz"
    if checkpoint := hpckit.get_checkpoint():
        with checkpoint.as_directory() as d:
            state = np.load(os.path.join(d, name))
            weights, velocity, start = state["weights"], state["velocity"], int(state["epoch"]) + 1
    for epoch in range(start, config["epochs"]):
        total = 0.0
        order = np.random.default_rng(epoch).permutation(SAMPLES)
        for batch in np.split(order, SAMPLES // BATCH):
            mine = batch[rank::size]
            error = x[mine] @ weights - y[mine]
            gradient = MPI.COMM_WORLD.allreduce(2 * x[mine].T @ error) / len(batch)
            velocity = 0.9 * velocity + gradient
            weights = weights - config["lr"] * velocity
            total += MPI.COMM_WORLD.allreduce(float(error @ error)) / len(batch)
        state = {"weights": weights, "velocity": velocity, "epoch": epoch}
        end_epoch(config, ctx, epoch, total, partial(np.savez, **state), name)
    if rank == 0:
        print("FINAL " + json.dumps({"params": [round(float(w), 12) for w in weights]}), flush=True)


def torch_loop(config: dict) -> None:
    import torch

    from hpckit.torch import prepare_data_loader, prepare_model

    g = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, FEATURES, generator=g)
    data = torch.utils.data.TensorDataset(x, x @ torch.arange(1.0, FEATURES + 1))
    torch.manual_seed(0)
    model = prepare_model(torch.nn.Linear(FEATURES, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)
    loader = prepare_data_loader(torch.utils.data.DataLoader(
        data, batch_size=BATCH, shuffle=True, num_workers=config["loader_workers"],
        persistent_workers=config["loader_workers"] > 0))
    start = 0
    if checkpoint := hpckit.get_checkpoint():
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"), weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["epoch"] + 1
    ctx = hpckit.get_context()
    for epoch in range(start, config["epochs"]):
        loader.epoch = epoch  # the sampler's shuffle depends only on the epoch
        total = 0.0
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(xb).squeeze(-1), yb)
            loss.backward()
            optimizer.step()
            total += loss.item()
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}
        end_epoch(config, ctx, epoch, total, partial(torch.save, state), "state.pt")
    if ctx.get_world_rank() == 0:
        params = [round(p.item(), 12) for p in model.parameters() for p in p.flatten()]
        print("FINAL " + json.dumps({"params": params}), flush=True)


def end_epoch(config: dict, ctx, epoch: int, total: float, save, name: str) -> None:
    """The epoch's pause, its preemption notice if asked, and its report with rank 0's
    checkpoint (``save(path)`` writes the state to the file ``name``)."""
    time.sleep(config["epoch_seconds"])
    try:
        with tempfile.TemporaryDirectory() as d:
            checkpoint = None
            if ctx.get_world_rank() == 0 or config.get("every_rank_saves"):
                save(os.path.join(d, name))
                checkpoint = Checkpoint.from_directory(d)
            hpckit.report({"epoch": epoch, "loss": total}, checkpoint=checkpoint)
    finally:  # also where the report stops the run: a warning that came during it
        if config["preemption_info"]:
            say_preemption(ctx.get_world_rank())


_said: list[int] = []


def say_preemption(rank: int) -> None:
    """Once a run: the preemption notice, as soon as this rank is told."""
    if not _said and (info := hpckit.get_preemption_info()):
        _said.append(info.deadline_ms)
        print(f"PREEMPTION {json.dumps({'deadline_ms': info.deadline_ms, 'seen': time.time()})}"
              f" rank {rank} END", flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--storage", default=None)
    p.add_argument("--name", default=None)
    p.add_argument("--workers", type=int, default=int(os.environ.get("PMI_SIZE", "1")))
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--epoch-seconds", type=float, default=0.0)
    p.add_argument("--first-run-epoch-seconds", type=float, default=None,
                   help="the pause in a Slurm job's first run (SLURM_RESTART_COUNT 0 or unset); "
                        "--epoch-seconds in its requeued runs")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--torch", action="store_true", help="TorchTrainer, DDP and a DataLoader")
    p.add_argument("--loader-workers", type=int, default=0, help="with --torch")
    p.add_argument("--preemption-info", action="store_true",
                   help="ask get_preemption_info() every epoch; print it once the job is told")
    p.add_argument("--show-hosts", action="store_true", help="each rank prints its host")
    p.add_argument("--min-workers", type=int, default=None,
                   help="elastic: ScalingConfig(num_workers=(min_workers, workers))")
    p.add_argument("--resize-interval", type=float, default=60.0,
                   help="ScalingConfig(elastic_resize_monitor_interval_s)")
    p.add_argument("--max-failures", type=int, default=0, help="FailureConfig(max_failures)")
    p.add_argument("--cache-dir", default=None, help="CheckpointConfig(cache_dir)")
    p.add_argument("--persist-every", type=int, default=1, help="CheckpointConfig(persist_every)")
    p.add_argument("--redundancy", default=None, help="CheckpointConfig(redundancy)")
    p.add_argument("--every-rank-saves", action="store_true",
                   help="each rank's checkpoint holds its own copy of the (replicated) state")
    args = p.parse_args()
    if args.first_run_epoch_seconds is not None and \
            os.environ.get("SLURM_RESTART_COUNT", "0") == "0":
        args.epoch_seconds = args.first_run_epoch_seconds
    if args.torch:
        from hpckit.torch import TorchTrainer as Trainer
    else:
        Trainer = DataParallelTrainer
    Trainer(torch_loop if args.torch else numpy_loop,
            train_loop_config={"epochs": args.epochs, "epoch_seconds": args.epoch_seconds,
                               "lr": args.lr, "preemption_info": args.preemption_info,
                               "loader_workers": args.loader_workers,
                               "show_hosts": args.show_hosts,
                               "every_rank_saves": args.every_rank_saves},
            scaling_config=ScalingConfig(
                num_workers=args.workers if args.min_workers is None else
                (args.min_workers, args.workers),
                elastic_resize_monitor_interval_s=args.resize_interval),
            run_config=RunConfig(name=args.name, storage_path=args.storage,
                                 failure_config=FailureConfig(max_failures=args.max_failures),
                                 checkpoint_config=CheckpointConfig(
                                     cache_dir=args.cache_dir, persist_every=args.persist_every,
                                     redundancy=args.redundancy))
            ).fit()


if __name__ == "__main__":
    main()

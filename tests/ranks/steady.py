"""Deterministic training: the same epochs give the same parameters, however often the run
is stopped and resumed. Rank 0 prints ``FINAL {json}`` when training finishes."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import torch

import hpckit
from hpckit import Checkpoint, RunConfig, ScalingConfig
from hpckit.torch import TorchTrainer, prepare_data_loader, prepare_model


def train_loop(config: dict) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 8, generator=g)
    data = torch.utils.data.TensorDataset(x, x @ torch.arange(1.0, 9.0))
    torch.manual_seed(0)
    model = prepare_model(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)
    loader = prepare_data_loader(torch.utils.data.DataLoader(
        data, batch_size=16, shuffle=True, num_workers=config["loader_workers"],
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
        time.sleep(config["epoch_seconds"])
        if config["preemption_info"] and (info := hpckit.get_preemption_info()):
            print(f"PREEMPTION {json.dumps({'deadline_ms': info.deadline_ms, 'seen': time.time()})}"
                  f" rank {ctx.get_world_rank()} END", flush=True)
        with tempfile.TemporaryDirectory() as d:
            checkpoint = None
            if ctx.get_world_rank() == 0:
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                            "epoch": epoch}, os.path.join(d, "state.pt"))
                checkpoint = Checkpoint.from_directory(d)
            hpckit.report({"epoch": epoch, "loss": total}, checkpoint=checkpoint)
    if ctx.get_world_rank() == 0:
        params = [round(p.item(), 12) for p in model.parameters() for p in p.flatten()]
        print("FINAL " + json.dumps({"params": params}), flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--storage", default=None)
    p.add_argument("--name", default=None)
    p.add_argument("--workers", type=int, default=int(os.environ.get("PMI_SIZE", "1")))
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--epoch-seconds", type=float, default=0.0)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--loader-workers", type=int, default=0)
    p.add_argument("--preemption-info", action="store_true",
                   help="ask get_preemption_info() every epoch; print it once the job is told")
    args = p.parse_args()
    TorchTrainer(train_loop,
                 train_loop_config={"epochs": args.epochs, "epoch_seconds": args.epoch_seconds,
                                    "lr": args.lr, "preemption_info": args.preemption_info,
                                    "loader_workers": args.loader_workers},
                 scaling_config=ScalingConfig(num_workers=args.workers),
                 run_config=RunConfig(name=args.name, storage_path=args.storage)).fit()


if __name__ == "__main__":
    main()

"""Loaders users write, killed and resumed (#66): two ranks train with ``TorchTrainer`` on
an ``IterableDataset`` that shuffles with ``torch.randperm`` in ``__iter__``, taking
``STEPS_PER_EPOCH`` batches of each pass (a ``break``, as a ``steps_per_epoch`` loop does),
and after each epoch score a validation loader (their own ``torch.Generator``,
``add_dist_sampler=False``) cut at two batches with ``break``. A checkpoint at every third
step (mid-pass) and at the end of every second epoch (after the breaks). ``--kill RANK:STEP``
(repeatable) SIGKILLs that rank once when it reaches that step; ``FailureConfig`` restarts
the ranks. Rank 0 prints ``FINAL {json}`` with the parameters' bytes (hex) and the
validation losses it reported. ``--loader-workers N`` gives the validation loader N worker
processes; ``--later-workers M`` gives it M in every attempt after the first (a program
changed between a kill and its resume)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import tempfile

import torch
import torch.nn.functional as F

import hpckit
from hpckit import Checkpoint, FailureConfig, RunConfig, ScalingConfig
from hpckit.torch import TorchTrainer, prepare_data_loader, prepare_model

SAMPLES, BATCH, STEPS_PER_EPOCH = 40, 3, 4  # 20 a rank: 7 batches a pass, 4 of them taken


def sample(index: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(4, generator=torch.Generator().manual_seed(index))
    return x, x.sum(dim=0, keepdim=True)


class Stream(torch.utils.data.IterableDataset):
    """This rank's share of a fresh random order at each pass."""

    def __iter__(self):
        context = hpckit.get_context()
        order = torch.randperm(SAMPLES).tolist()
        mine = order[context.get_world_rank()::context.get_world_size()]
        return (sample(index) for index in mine)


class Held(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 10

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return sample(1000 + index)


def kill_once(config: dict, rank: int, step: int) -> None:
    for kill in config["kill"]:
        marker = os.path.join(config["markers"], kill.replace(":", "-"))
        if kill == f"{rank}:{step}" and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)


def checkpoint_of(state: dict, rank: int, directory: str):
    if rank != 0:
        return None
    torch.save(state, os.path.join(directory, "state.pt"))
    return Checkpoint.from_directory(directory)


def train(config: dict) -> None:
    torch.manual_seed(0)
    model = prepare_model(torch.nn.Sequential(
        torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(16, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    attempt = len([m for m in os.listdir(config["markers"])]) if config["markers"] else 0
    workers = config["later_workers"] if attempt and config["later_workers"] is not None \
        else config["loader_workers"]
    loader = prepare_data_loader(torch.utils.data.DataLoader(Stream(), batch_size=BATCH))
    held = prepare_data_loader(torch.utils.data.DataLoader(
        Held(), batch_size=2, shuffle=True, num_workers=workers,
        generator=torch.Generator().manual_seed(7)), add_dist_sampler=False)
    step, epoch, in_epoch, scores = 0, 0, 0, []
    if checkpoint := hpckit.get_checkpoint():
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"), weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step, epoch, in_epoch, scores = state["step"], state["epoch"], state["in_epoch"], state["scores"]
    rank = hpckit.get_context().get_world_rank()
    while epoch < config["epochs"]:
        for number, (x, y) in enumerate(loader, start=in_epoch):
            if number == STEPS_PER_EPOCH:
                break
            loss = F.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            kill_once(config, rank, step)
            with tempfile.TemporaryDirectory() as d:
                state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                         "step": step, "epoch": epoch, "in_epoch": number + 1, "scores": scores}
                hpckit.report({"loss": loss.item(), "step": step},
                              checkpoint=checkpoint_of(state, rank, d) if step % 3 == 0 else None)
        with torch.no_grad():
            score = sum(F.mse_loss(model(x), y).item()
                        for number, (x, y) in zip(range(2), held))
        scores.append(score)
        epoch, in_epoch = epoch + 1, 0
        with tempfile.TemporaryDirectory() as d:
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                     "step": step, "epoch": epoch, "in_epoch": 0, "scores": scores}
            hpckit.report({"val_loss": score, "step": step},
                          checkpoint=checkpoint_of(state, rank, d) if epoch % 2 == 0 else None)
    if rank == 0:
        params = [p.detach().cpu().numpy().tobytes().hex() for p in model.parameters()]
        print("FINAL " + json.dumps({"params": params, "scores": scores}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--storage", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--kill", action="append", default=[])
    parser.add_argument("--markers", default="")
    parser.add_argument("--loader-workers", type=int, default=0)
    parser.add_argument("--later-workers", type=int, default=None)
    args = parser.parse_args()
    TorchTrainer(
        train, train_loop_config={"epochs": args.epochs, "kill": args.kill,
                                  "markers": args.markers, "loader_workers": args.loader_workers,
                                  "later_workers": args.later_workers},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=args.storage, name=args.name,
                             failure_config=FailureConfig(max_failures=len(args.kill))),
    ).fit()


if __name__ == "__main__":
    main()

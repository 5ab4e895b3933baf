"""Image classification from HDF5 with DDP on CPU ranks, top-2 checkpoints by accuracy.

Writes a FashionMNIST-shaped synthetic dataset (28x28 grey images, 10 classes) to an HDF5
file, reads it lazily (each rank its own share, each DataLoader worker its own file handle),
trains a small CNN, and checkpoints every epoch keeping the two most accurate:

    python examples/fashion_hdf5.py --workers 2
    mpiexec -n 2 python examples/fashion_hdf5.py --workers 2
    hpckit ls ~/hpckit_results/fashion-hdf5
"""

from __future__ import annotations

import argparse
import os
import tempfile

import h5py
import numpy as np
import torch
import torch.distributed as dist
from torch import nn

import hpckit
from hpckit import Checkpoint, CheckpointConfig, RunConfig, ScalingConfig
from hpckit.torch import HDF5Dataset, TorchTrainer, load_state, prepare_data_loader, prepare_model


def write_dataset(path: str, n_train: int = 6000, n_test: int = 1000, seed: int = 0) -> None:
    """Each class is a smooth random pattern; samples are shifted, scaled and noisy copies."""
    rng = np.random.default_rng(seed)
    coarse = rng.random((10, 7, 7), dtype=np.float32)
    prototypes = np.kron(coarse, np.ones((4, 4), dtype=np.float32))  # 10 x 28 x 28

    def split(n: int) -> tuple[np.ndarray, np.ndarray]:
        labels = rng.integers(0, 10, n)
        images = prototypes[labels] * rng.uniform(0.6, 1.4, (n, 1, 1)).astype(np.float32)
        shifts = rng.integers(-2, 3, (n, 2))
        images = np.stack([np.roll(img, tuple(s), axis=(0, 1))
                           for img, s in zip(images, shifts, strict=True)])
        images += rng.normal(0, 0.35, images.shape).astype(np.float32)
        return (np.clip(images, 0, 1.5) * 170).astype(np.uint8), labels.astype(np.int64)

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    partial = f"{path}.{os.getpid()}.tmp"  # ranks started by mpiexec may all write it at once
    with h5py.File(partial, "w") as f:
        for name, n in (("train", n_train), ("test", n_test)):
            images, labels = split(n)
            f.create_dataset(f"{name}/images", data=images[:, None], chunks=(64, 1, 28, 28))
            f.create_dataset(f"{name}/labels", data=labels)
    os.replace(partial, path)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Linear(32 * 5 * 5, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


def to_float(sample: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    image, label = sample
    return image.float() / 255.0, label


def loader(path: str, split: str, shuffle: bool, batch_size: int, workers: int = 1) -> object:
    dataset = HDF5Dataset(path, (f"{split}/images", f"{split}/labels"), transform=to_float)
    # forkserver: a rank runs threads (hpckit's writer, Gloo's), and a worker forked from a
    # threaded process can hang in the child on a lock another thread held (docs/site.md).
    return prepare_data_loader(torch.utils.data.DataLoader(
        dataset, batch_size=batch_size, shuffle=shuffle, num_workers=workers,
        persistent_workers=workers > 0, multiprocessing_context="forkserver" if workers else None))


def train_loop(config: dict) -> None:
    torch.manual_seed(0)
    model = prepare_model(Net())
    optimizer = torch.optim.Adam(model.parameters(), lr=config["lr"])
    workers = config.get("loader_workers", 1)
    train, test = (loader(config["data"], "train", True, config.get("batch_size", 64), workers),
                   loader(config["data"], "test", False, 256, workers))
    start = 0
    checkpoint = hpckit.get_checkpoint()
    if checkpoint:
        state = load_state(checkpoint, "model.pt")  # checked against the manifest; weights only
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["epoch"] + 1
        train.epoch = start  # so the sampler's shuffle continues where it left off
    for epoch in range(start, config["epochs"]):
        model.train()
        for images, labels in train:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(images), labels)
            loss.backward()
            optimizer.step()
        accuracy, test_loss = evaluate(model, test)
        with tempfile.TemporaryDirectory() as d:
            checkpoint = None
            if hpckit.get_context().get_world_rank() == 0:
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                            "epoch": epoch}, os.path.join(d, "model.pt"))
                checkpoint = Checkpoint.from_directory(d)
            hpckit.report({"epoch": epoch, "accuracy": accuracy, "loss": test_loss},
                          checkpoint=checkpoint)


def evaluate(model: nn.Module, test: object) -> tuple[float, float]:
    model.eval()
    totals = torch.zeros(3)  # correct, loss sum, count
    with torch.no_grad():
        for images, labels in test:
            logits = model(images)
            totals += torch.tensor([(logits.argmax(1) == labels).sum().item(),
                                    nn.functional.cross_entropy(logits, labels, reduction="sum").item(),
                                    len(labels)])
    if dist.is_initialized():
        dist.all_reduce(totals)
    return (totals[0] / totals[2]).item(), (totals[1] / totals[2]).item()


def arguments(description: str, name: str) -> argparse.ArgumentParser:
    """The command line this example and lightning_mnist_like.py share."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "hpckit-fashion.h5"),
                        help="the HDF5 file, written first if it does not exist")
    parser.add_argument("--storage", default=None, help="storage path or URI (default ~/hpckit_results)")
    parser.add_argument("--name", default=name)
    return parser


def with_loader_workers(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--loader-workers", type=int, default=1,
                        help="data loader worker processes per loader and rank (0: none)")
    return parser


def main() -> None:
    args = with_loader_workers(arguments("FashionMNIST-shaped HDF5 training with hpckit",
                                         "fashion-hdf5")).parse_args()
    if not os.path.exists(args.data):
        write_dataset(args.data)
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"epochs": args.epochs, "lr": args.lr, "data": args.data,
                           "loader_workers": args.loader_workers},
        scaling_config=ScalingConfig(num_workers=args.workers),
        run_config=RunConfig(
            name=args.name, storage_path=args.storage,
            checkpoint_config=CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="accuracy",
                                               checkpoint_score_order="max")))
    result = trainer.fit()
    if hpckit.world_rank() == 0:
        best, metrics = result.best_checkpoints[-1]  # worst to best, as in Ray
        print(f"accuracy {result.metrics['accuracy']:.3f} after epoch {result.metrics['epoch']}; "
              f"best {metrics['accuracy']:.3f} at {best.path}")


if __name__ == "__main__":
    main()

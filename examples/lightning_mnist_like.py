"""PyTorch Lightning on hpckit: the CNN of fashion_hdf5.py as a LightningModule, on the same
FashionMNIST-shaped HDF5 data, DDP over CPU ranks, keeping the two checkpoints with the
lowest validation loss. Run it again with more epochs and it resumes where it stopped:

    mpiexec -n 2 python examples/lightning_mnist_like.py --epochs 2
    mpiexec -n 2 python examples/lightning_mnist_like.py --epochs 3     # resumes at epoch 2
    python examples/lightning_mnist_like.py --workers 2                 # hpckit starts the ranks

The Lightning lines are those of Ray Train's guide with ``ray.train.lightning`` replaced by
``hpckit.lightning``. Needs ``pip install -e '.[lightning]'`` in hpckit's clone.
"""

from __future__ import annotations

import os

import lightning.pytorch as pl
import torch
from fashion_hdf5 import Net, arguments, to_float, write_dataset
from torch import nn

import hpckit
from hpckit import CheckpointConfig, RunConfig, ScalingConfig
from hpckit.lightning import (
    RayDDPStrategy,
    RayLightningEnvironment,
    RayTrainReportCallback,
    prepare_trainer,
)
from hpckit.torch import HDF5Dataset, TorchTrainer


class Classifier(pl.LightningModule):
    def __init__(self, lr: float) -> None:
        super().__init__()
        self.lr = lr
        self.net = Net()

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> torch.Tensor:
        images, labels = batch
        loss = nn.functional.cross_entropy(self.net(images), labels)
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> None:
        images, labels = batch
        logits = self.net(images)
        self.log("val_loss", nn.functional.cross_entropy(logits, labels), sync_dist=True)
        self.log("val_accuracy", (logits.argmax(1) == labels).float().mean(), sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.lr)


def loader(path: str, split: str, shuffle: bool, limit: int) -> torch.utils.data.DataLoader:
    """Lightning adds the DistributedSampler itself (RayDDPStrategy tells it the world)."""
    dataset = HDF5Dataset(path, (f"{split}/images", f"{split}/labels"), transform=to_float)
    subset = torch.utils.data.Subset(dataset, range(min(limit, len(dataset))))
    return torch.utils.data.DataLoader(subset, batch_size=64, shuffle=shuffle)


def train_func(config: dict) -> None:
    torch.manual_seed(0)
    model = Classifier(config["lr"])
    train = loader(config["data"], "train", True, config["samples"])
    val = loader(config["data"], "test", False, config["samples"] // 4)
    trainer = pl.Trainer(
        max_epochs=config["epochs"], accelerator="cpu", devices="auto",
        strategy=RayDDPStrategy(), plugins=[RayLightningEnvironment()],
        callbacks=[RayTrainReportCallback()], enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, logger=False)
    trainer = prepare_trainer(trainer)
    checkpoint = hpckit.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:
            path = os.path.join(d, RayTrainReportCallback.CHECKPOINT_NAME)
            trainer.fit(model, train, val, ckpt_path=path)
    else:
        trainer.fit(model, train, val)


def main() -> None:
    parser = arguments("Lightning on hpckit, FashionMNIST-shaped", "lightning-mnist-like")
    parser.add_argument("--samples", type=int, default=2048, help="training images used")
    args = parser.parse_args()
    if not os.path.exists(args.data):
        write_dataset(args.data)
    trainer = TorchTrainer(
        train_func,
        train_loop_config={"epochs": args.epochs, "lr": args.lr, "data": args.data,
                           "samples": args.samples},
        scaling_config=ScalingConfig(num_workers=args.workers),
        run_config=RunConfig(
            name=args.name, storage_path=args.storage,
            checkpoint_config=CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="val_loss",
                                               checkpoint_score_order="min")))
    result = trainer.fit()
    if hpckit.world_rank() == 0:  # the Result is printed once
        best, metrics = result.best_checkpoints[-1]
        print(f"val_loss {result.metrics['val_loss']:.3f} after epoch {result.metrics['epoch']} "
              f"(step {result.metrics['step']}); best {metrics['val_loss']:.3f} at {best.path}")


if __name__ == "__main__":
    main()

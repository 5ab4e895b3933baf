"""Ray Train's "Get Started with Distributed Training using PyTorch Lightning" program, ported
to hpckit the way the compatibility promise says: the imports changed (``ray.train`` became
``hpckit``), and the lines that fetch the model and the data became local ones (a small CNN
for torchvision's ResNet-18, random FashionMNIST-shaped tensors for the download, CPUs for
GPUs). The rest keeps the guide's shape: the Lightning Trainer with Ray's strategy,
environment and report callback, ``prepare_trainer``, resuming from ``get_checkpoint()``, and
loading ``result.checkpoint`` afterwards. ``STORAGE`` and ``EPOCHS`` come from the
environment so that a test can run it again and see it resume."""

import os

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

import hpckit  # was: import ray.train
import hpckit.lightning  # was: import ray.train.lightning
from hpckit import RunConfig, ScalingConfig  # was: from ray.train import ...
from hpckit.torch import TorchTrainer  # was: from ray.train.torch import TorchTrainer

EPOCHS = int(os.environ.get("EPOCHS", "2"))  # local: the guide trains for 10


class ImageClassifier(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.model = torch.nn.Sequential(  # local: the guide adapts torchvision's resnet18
            torch.nn.Conv2d(1, 8, 3), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(4),
            torch.nn.Flatten(), torch.nn.Linear(128, 10))
        self.criterion = torch.nn.CrossEntropyLoss()

    def forward(self, x):
        return self.model(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = self.criterion(self.forward(x), y)
        self.log("loss", loss, on_step=True, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.model.parameters(), lr=0.001)


def train_func():
    model = ImageClassifier()
    generator = torch.Generator().manual_seed(0)  # local: the guide downloads FashionMNIST
    train_data = TensorDataset(torch.rand(512, 1, 28, 28, generator=generator),
                               torch.randint(0, 10, (512,), generator=generator))
    train_dataloader = DataLoader(train_data, batch_size=128, shuffle=True)

    trainer = pl.Trainer(
        max_epochs=EPOCHS,
        devices="auto",
        accelerator="auto",
        strategy=hpckit.lightning.RayDDPStrategy(),
        plugins=[hpckit.lightning.RayLightningEnvironment()],
        callbacks=[hpckit.lightning.RayTrainReportCallback()],
        enable_checkpointing=False,
    )
    trainer = hpckit.lightning.prepare_trainer(trainer)

    checkpoint = hpckit.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as ckpt_dir:
            ckpt_path = os.path.join(ckpt_dir, "checkpoint.ckpt")
            trainer.fit(model, train_dataloaders=train_dataloader, ckpt_path=ckpt_path)
    else:
        trainer.fit(model, train_dataloaders=train_dataloader)


scaling_config = ScalingConfig(num_workers=2, use_gpu=False)  # local: the guide has GPUs
run_config = RunConfig(storage_path=os.environ["STORAGE"], name="lightning_guide")
trainer = TorchTrainer(train_func, scaling_config=scaling_config, run_config=run_config)
result = trainer.fit()

with result.checkpoint.as_directory() as checkpoint_dir:
    model = ImageClassifier.load_from_checkpoint(
        os.path.join(checkpoint_dir, hpckit.lightning.RayTrainReportCallback.CHECKPOINT_NAME))
    if os.environ.get("PMI_RANK", os.environ.get("SLURM_PROCID", "0")) == "0":  # the test's
        print(f"LOADED {result.checkpoint.path} epoch {result.metrics['epoch']}", flush=True)

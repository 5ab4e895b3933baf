"""Linear regression with DDP, a checkpoint every epoch, top-2 by loss, and resume.

    python examples/linear.py --workers 2            # hpckit starts 2 ranks
    mpiexec -n 3 python examples/linear.py --workers 3
    python examples/linear.py --workers 2            # again: resumes the same experiment
"""

from __future__ import annotations

import argparse
import os
import tempfile

import torch

import hpckit
from hpckit import Checkpoint, CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from hpckit.torch import TorchTrainer, load_state, prepare_data_loader, prepare_model


def make_data(n: int = 512, seed: int = 0) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    w = torch.arange(1.0, 9.0)
    return torch.utils.data.TensorDataset(x, x @ w + 0.5 + 0.01 * torch.randn(n, generator=g))


def train_loop(config: dict) -> None:
    torch.manual_seed(config.get("seed", 0))
    model = prepare_model(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
    loader = prepare_data_loader(
        torch.utils.data.DataLoader(make_data(), batch_size=32, shuffle=True))
    start = 0
    checkpoint = hpckit.get_checkpoint()
    if checkpoint:
        state = load_state(checkpoint, "model.pt")  # checked against the manifest; weights only
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["epoch"] + 1
    for epoch in range(start, config["epochs"]):
        total, count = 0.0, 0
        for x, y in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x).squeeze(-1), y)
            loss.backward()
            optimizer.step()
            total, count = total + loss.item() * len(x), count + len(x)
        if config.get("fail_at_epoch") == epoch and hpckit.get_context().get_attempt() == 0:
            raise RuntimeError(f"injected failure at epoch {epoch}")
        with tempfile.TemporaryDirectory() as d:
            checkpoint = None
            if hpckit.get_context().get_world_rank() == 0:
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                            "epoch": epoch}, os.path.join(d, "model.pt"))
                checkpoint = Checkpoint.from_directory(d)
            hpckit.report({"loss": total / count, "epoch": epoch}, checkpoint=checkpoint)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--storage", default=None, help="storage path or URI")
    parser.add_argument("--name", default="linear")
    parser.add_argument("--max-failures", type=int, default=0)
    parser.add_argument("--fail-at-epoch", type=int, default=None)
    parser.add_argument("--cache-dir", default=None,
                        help="node-local checkpoint cache (docs/multilevel.md)")
    parser.add_argument("--persist-every", type=int, default=1,
                        help="with --cache-dir: every Nth checkpoint also goes to storage")
    args = parser.parse_args()
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"lr": args.lr, "epochs": args.epochs, "fail_at_epoch": args.fail_at_epoch},
        scaling_config=ScalingConfig(num_workers=args.workers),
        run_config=RunConfig(
            name=args.name, storage_path=args.storage,
            checkpoint_config=CheckpointConfig(
                num_to_keep=2, checkpoint_score_attribute="loss", checkpoint_score_order="min",
                cache_dir=args.cache_dir, persist_every=args.persist_every,
                redundancy="partner" if args.cache_dir else None),
            failure_config=FailureConfig(max_failures=args.max_failures)),
    )
    result = trainer.fit()
    if hpckit.world_rank() == 0:
        print(f"final loss {result.metrics['loss']:.4f}; latest {result.checkpoint}; "
              f"best {result.best_checkpoints[-1][0]}")


if __name__ == "__main__":
    main()

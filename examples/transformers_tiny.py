"""Hugging Face Transformers on hpckit: a tiny GPT-2, built from a config (nothing is
downloaded), learns synthetic token sequences with the ``Trainer``, data-parallel over CPU
ranks, keeping the two checkpoints with the lowest evaluation loss. Run it again with more
epochs and it resumes where it stopped:

    mpiexec -n 2 python examples/transformers_tiny.py --epochs 2
    mpiexec -n 2 python examples/transformers_tiny.py --epochs 3     # resumes after epoch 2
    python examples/transformers_tiny.py --workers 2                 # hpckit starts the ranks

The Trainer lines are those of Ray Train's guide with ``ray.train.huggingface.transformers``
replaced by ``hpckit.transformers``. Needs ``pip install -e '.[transformers]'`` in hpckit's clone.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

import hpckit
from hpckit import CheckpointConfig, RunConfig, ScalingConfig
from hpckit.torch import TorchTrainer
from hpckit.transformers import RayTrainReportCallback, prepare_trainer

VOCAB, LENGTH = 64, 32


class Counting(torch.utils.data.Dataset):
    """Sequences that count up from a random start by a random stride (mod VOCAB): after two
    tokens the rest is predictable, so the loss falls quickly."""

    def __init__(self, size: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        starts = torch.randint(0, VOCAB, (size, 1), generator=generator)
        strides = torch.randint(1, 4, (size, 1), generator=generator)
        self.tokens = (starts + strides * torch.arange(LENGTH)) % VOCAB

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[i], "labels": self.tokens[i]}


def train_func(config: dict) -> None:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=LENGTH, n_embd=64,
                                       n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0))
    with tempfile.TemporaryDirectory() as scratch:  # the Trainer's own saves; hpckit keeps copies
        args = TrainingArguments(
            output_dir=scratch, num_train_epochs=config["epochs"], per_device_train_batch_size=32,
            learning_rate=3e-3, eval_strategy="epoch", save_strategy="epoch", save_total_limit=1,
            logging_strategy="epoch", use_cpu=True, report_to="none", disable_tqdm=True, seed=0,
            ddp_find_unused_parameters=False)
        trainer = Trainer(model=model, args=args, train_dataset=Counting(config["samples"], 1),
                          eval_dataset=Counting(256, 2), callbacks=[RayTrainReportCallback()])
        trainer = prepare_trainer(trainer)
        checkpoint = hpckit.get_checkpoint()
        if checkpoint:
            with checkpoint.as_directory() as d:
                path = os.path.join(d, RayTrainReportCallback.CHECKPOINT_NAME)
                trainer.train(resume_from_checkpoint=path)
        else:
            trainer.train()


def main() -> None:
    parser = argparse.ArgumentParser(description="A tiny GPT-2 with the Transformers Trainer")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=1024, help="training sequences")
    parser.add_argument("--storage", default=None, help="storage path or URI (default ~/hpckit_results)")
    parser.add_argument("--name", default="transformers-tiny")
    args = parser.parse_args()
    trainer = TorchTrainer(
        train_func, train_loop_config={"epochs": args.epochs, "samples": args.samples},
        scaling_config=ScalingConfig(num_workers=args.workers),
        run_config=RunConfig(
            name=args.name, storage_path=args.storage,
            checkpoint_config=CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="eval_loss",
                                               checkpoint_score_order="min")))
    result = trainer.fit()
    if hpckit.world_rank() == 0:  # the Result is printed once
        best, metrics = result.best_checkpoints[-1]
        print(f"eval_loss {result.metrics['eval_loss']:.3f} at step {result.metrics['step']}; "
              f"best {metrics['eval_loss']:.3f} at {best.path}")


if __name__ == "__main__":
    main()

"""Ray Train's "Get Started with Distributed Training using Hugging Face Transformers"
program, ported to hpckit the way the compatibility promise says: the imports changed
(``ray.train`` became ``hpckit``), and the lines that fetch the model, tokenizer, data and
metric became local ones (a tiny BERT built from a config for ``bert-base-cased``, random
token ids for the Yelp reviews, NumPy accuracy for ``evaluate``, CPUs for GPUs). The rest
keeps the guide's shape, with the resume lines of Ray's checkpointing guide, and loads
``result.checkpoint`` afterwards. Transformers 5 renamed ``evaluation_strategy`` to
``eval_strategy``. ``STORAGE`` and ``EPOCHS`` come from the environment so that a test can run
it again and see it resume."""

import os

import numpy as np
import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

import hpckit  # was: import ray.train
import hpckit.transformers  # was: import ray.train.huggingface.transformers
from hpckit import RunConfig, ScalingConfig  # was: from ray.train import ...
from hpckit.torch import TorchTrainer  # was: from ray.train.torch import TorchTrainer

EPOCHS = int(os.environ.get("EPOCHS", "2"))  # local: the guide trains for 3


class Reviews(torch.utils.data.Dataset):
    """Local: the guide tokenizes yelp_review_full; these are random ids with 5 labels."""

    def __init__(self, size, seed):
        generator = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(1, 100, (size, 16), generator=generator)
        self.labels = self.ids[:, 0] % 5

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(16, dtype=torch.long),
                "labels": self.labels[i]}


def compute_metrics(eval_pred):
    logits, labels = eval_pred
    return {"accuracy": float((np.argmax(logits, axis=-1) == labels).mean())}


def train_func():
    model = BertForSequenceClassification(BertConfig(  # local: from_pretrained("bert-base-cased")
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=16, num_labels=5))
    training_args = TrainingArguments(
        output_dir="test_trainer", eval_strategy="epoch", save_strategy="epoch",
        report_to="none", num_train_epochs=EPOCHS, use_cpu=True)
    trainer = Trainer(model=model, args=training_args, train_dataset=Reviews(256, 0),
                      eval_dataset=Reviews(64, 1), compute_metrics=compute_metrics)

    callback = hpckit.transformers.RayTrainReportCallback()
    trainer.add_callback(callback)
    trainer = hpckit.transformers.prepare_trainer(trainer)

    checkpoint = hpckit.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as checkpoint_dir:
            checkpoint_path = os.path.join(checkpoint_dir,
                                           hpckit.transformers.RayTrainReportCallback.CHECKPOINT_NAME)
            trainer.train(resume_from_checkpoint=checkpoint_path)
    else:
        trainer.train()


scaling_config = ScalingConfig(num_workers=2, use_gpu=False)  # local: the guide has GPUs
run_config = RunConfig(storage_path=os.environ["STORAGE"], name="transformers_guide")
ray_trainer = TorchTrainer(train_func, scaling_config=scaling_config, run_config=run_config)
result = ray_trainer.fit()

with result.checkpoint.as_directory() as checkpoint_dir:
    checkpoint_path = os.path.join(checkpoint_dir,
                                   hpckit.transformers.RayTrainReportCallback.CHECKPOINT_NAME)
    model = BertForSequenceClassification.from_pretrained(checkpoint_path)
    if os.environ.get("PMI_RANK", os.environ.get("SLURM_PROCID", "0")) == "0":  # the test's
        print(f"LOADED {result.checkpoint.path} epoch {result.metrics['epoch']}", flush=True)

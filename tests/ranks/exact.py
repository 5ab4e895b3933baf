"""Training whose every step draws random numbers: a shuffled loader with two worker
processes, dropout, SGD with momentum; a checkpoint every 5 steps, mid-epoch, written by rank
0 alone (the README's loop: model and loader built, then ``get_checkpoint()``). ``--kill
RANK:STEP`` (repeatable) SIGKILLs that rank once when it reaches that step, before its report
(see ``killed_once``);
``FailureConfig`` restarts the ranks. Rank 0 prints ``FINAL {json}`` with the parameters'
bytes (hex) when training finishes. ``--mlflow URI`` logs the run there
(``MLflowLoggerCallback``, the MLflow experiment named as the run).

torch is imported in the training function, not at the top: ``python exact.py`` only starts
the ranks, and so skips torch's import (seconds of CPU, in every run of the tests)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import tempfile
import time
from collections.abc import Iterator

import hpckit
from hpckit import Checkpoint, CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from hpckit.torch import TorchTrainer

SAMPLES, BATCH = 44, 3  # 22 a rank: 8 batches an epoch, the last of one sample


def killed_once(config: dict, rank: int, step: int) -> None:
    """SIGKILL this rank once at the step ``--kill`` names, once the checkpoint reported two
    checkpoints before it is committed (ASYNC commits it by then: the report of the one
    after waits for it), so that the restart resumes from a checkpoint taken mid-epoch."""
    for kill in config["kill"]:
        marker = os.path.join(config["markers"], kill.replace(":", "-"))
        if kill == f"{rank}:{step}" and not os.path.exists(marker):
            committed(config["experiment"], f"checkpoint_{step // 5 - 2:06d}")
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)


def committed(experiment: str, directory: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            with open(os.path.join(experiment, "manifest.json")) as f:
                if any(c["directory"] == directory for c in json.load(f)["checkpoints"]):
                    return
        time.sleep(0.05)
    raise AssertionError(f"{directory} was not committed within 30 s")


@contextlib.contextmanager
def handed(cached: str | None, state: dict | None) -> Iterator[Checkpoint | None]:
    """The checkpoint to report: ``save_state``'s, or with node-local caches (where a staged
    checkpoint goes to storage_path) a directory handed over, as Ray's guide writes one."""
    import torch

    from hpckit.torch import save_state

    if state is None or not cached:
        yield None if state is None else save_state(state, "model.pt")
        return
    with tempfile.TemporaryDirectory() as d:
        torch.save(state, os.path.join(d, "model.pt"))
        yield Checkpoint.from_directory(d)


def train(config: dict) -> None:
    import torch
    import torch.nn.functional as F

    from hpckit.torch import load_state, prepare_data_loader, prepare_model

    class Samples(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return SAMPLES

        def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
            x = torch.randn(4, generator=torch.Generator().manual_seed(index))
            return x, x.sum(dim=0, keepdim=True)

    torch.manual_seed(0)
    model = prepare_model(torch.nn.Sequential(
        torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(16, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    loader = prepare_data_loader(torch.utils.data.DataLoader(
        Samples(), batch_size=BATCH, shuffle=True, num_workers=2))
    step = 0
    if checkpoint := hpckit.get_checkpoint():
        state = load_state(checkpoint, "model.pt")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"]
    rank = hpckit.get_context().get_world_rank()
    while step < config["steps"]:
        for x, y in loader:
            loss = F.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            time.sleep(config["step_seconds"])
            killed_once(config, rank, step)
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
            with handed(config["cache"], state if step % 5 == 0 and rank == 0 else None) as saved:
                hpckit.report({"loss": loss.item(), "step": step}, checkpoint=saved,
                              checkpoint_upload_mode=config["mode"])
            if step == config["steps"]:
                break
    if rank == 0:
        params = [p.detach().cpu().numpy().tobytes().hex() for p in model.parameters()]
        print("FINAL " + json.dumps({"params": params}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--storage", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--kill", action="append", default=[])
    parser.add_argument("--markers", default="")
    parser.add_argument("--mode", default="async")
    parser.add_argument("--exact", choices=["on", "off"], default="on")
    parser.add_argument("--mlflow", default=None, help="an MLflow tracking URI to log to")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--gpu", action="store_true", help="use_gpu=True (NCCL, CUDA dropout)")
    parser.add_argument("--step-seconds", type=float, default=0.0, help="each step's sleep")
    parser.add_argument("--cache", default=None,
                        help="CheckpointConfig(cache_dir): every checkpoint but the last cached")
    parser.add_argument("--no-restart", action="store_true",
                        help="a kill ends the run (hpckit resume continues it)")
    args = parser.parse_args()
    callbacks = []
    if args.mlflow:
        from hpckit.mlflow import MLflowLoggerCallback

        callbacks.append(MLflowLoggerCallback(tracking_uri=args.mlflow, experiment_name=args.name))
    TorchTrainer(
        train, train_loop_config={"steps": args.steps, "kill": args.kill,
                                  "experiment": os.path.join(args.storage, args.name),
                                  "markers": args.markers, "mode": args.mode,
                                  "step_seconds": args.step_seconds, "cache": args.cache},
        scaling_config=ScalingConfig(num_workers=args.workers, use_gpu=args.gpu),
        run_config=RunConfig(storage_path=args.storage, name=args.name, callbacks=callbacks,
                             failure_config=FailureConfig(
                                 max_failures=0 if args.no_restart else len(args.kill)),
                             checkpoint_config=CheckpointConfig(
                                 num_to_keep=2, exact_resume=args.exact == "on",
                                 cache_dir=args.cache, persist_every=100 if args.cache else 1,
                                 redundancy="partner" if args.cache else None)),
    ).fit()


if __name__ == "__main__":
    main()

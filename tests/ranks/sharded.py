"""Deterministic NumPy training with a state shard per rank and no torch, so it starts in
well under a second and the fault tests can run it hundreds of times. Each checkpoint holds
two files per rank plus rank 0's meta.json; with ``--mode save-state`` (which imports torch)
one file per rank written by ``hpckit.torch.save_state``. Rank 0 prints ``FINAL {json}``
when done."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import socket
import sys
import tempfile
import time

import numpy as np
from mpi4py import MPI

import hpckit
from hpckit import (
    Checkpoint,
    CheckpointConfig,
    DataParallelTrainer,
    RunConfig,
    ScalingConfig,
    SyncConfig,
    ValidationConfig,
)


def train_loop(config: dict) -> None:
    ctx = hpckit.get_context()
    rank = ctx.get_world_rank()
    n = config["shard_floats"]
    state = np.random.default_rng(rank).standard_normal(n)
    momentum = np.zeros(n)
    start = 0
    if config["topology"]:
        place = {"rank": rank, "node_rank": ctx.get_node_rank(), "local_rank": ctx.get_local_rank(),
                 "local_world_size": ctx.get_local_world_size(), "host": socket.gethostname()}
        open(os.path.join(os.environ["HPCKIT_LOCAL_DIR"], f"rank-{rank}-was-here"), "w").close()
        print("PLACE " + json.dumps(place) + " END", flush=True)
    if checkpoint := hpckit.get_checkpoint():
        state, momentum, start = load(checkpoint, rank, config["mode"])
    for epoch in range(start, config["epochs"]):
        momentum = 0.9 * momentum + np.sin(epoch + rank + np.arange(n) * 1e-3)
        state = 0.5 * state + 0.1 * momentum
        loss = MPI.COMM_WORLD.allreduce(float(np.abs(state).mean()))
        time.sleep(config["epoch_seconds"])
        artifacts = ctx.get_artifact_dir()
        with open(os.path.join(artifacts, "log.txt"), "a") as f:
            f.write(f"epoch {epoch} loss {loss}\n")
        if epoch == start:
            with open(os.path.join(artifacts, "fixed.txt"), "w") as f:
                f.write(f"written once by rank {rank}\n")
        if epoch == config["stop_at"] and rank == 0:
            os.kill(os.getpid(), signal.SIGUSR2)  # as Slurm's warning would, before a report
        if (epoch + 1) % config["every"]:
            hpckit.report({"epoch": epoch, "loss": loss})
        else:
            save_and_report(config["mode"], rank, epoch, {"epoch": epoch, "loss": loss},
                            state, momentum, config.get("validate", False) and epoch % 4 == 3)
        if rank == 0 and config["artifacts"] != "off":
            print("ARTIFACT_DIR " + artifacts, flush=True)
            stored = os.path.join(ctx.get_experiment_path(), "artifacts", "rank-0", "fixed.txt")
            if os.path.exists(stored):
                print(f"STORED_FIXED {os.stat(stored).st_mtime_ns}", flush=True)
    digests = MPI.COMM_WORLD.gather(hashlib.sha256(state.tobytes() + momentum.tobytes()).hexdigest())
    if rank == 0:
        print("FINAL " + json.dumps({"shards": digests}), flush=True)


def load(checkpoint: Checkpoint, rank: int, mode: str) -> tuple:
    """This rank's state, momentum and the epoch to start from."""
    if mode == "save-state":
        from hpckit.torch import load_state

        saved = load_state(checkpoint, f"shard-rank{rank}.pt")
        return saved["state"].numpy(), saved["momentum"].numpy(), saved["epoch"] + 1
    with checkpoint.as_directory() as d:
        state = np.load(os.path.join(d, f"state-rank{rank}.npy"))
        momentum = np.load(os.path.join(d, f"momentum-rank{rank}.npy"))
        with open(os.path.join(d, "meta.json")) as f:
            return state, momentum, json.load(f)["epoch"] + 1


def validate(checkpoint: Checkpoint) -> dict:
    """--validate: the checkpoint's epoch, read back as a validation would read a model."""
    with checkpoint.as_directory() as d, open(os.path.join(d, "meta.json")) as f:
        return {"validated_epoch": json.load(f)["epoch"]}


def save_and_report(mode: str, rank: int, epoch: int, metrics: dict, state, momentum,
                    validation: bool = False) -> None:
    """One checkpoint: into a temporary directory handed to report() (sync or async), written
    in place into get_checkpoint_dir() (in-place, in-place-async), staged by save_state
    and reported asynchronously (save-state), or uploaded by the rank's own
    checkpoint_upload_fn in the background (upload-async)."""
    if mode == "save-state":
        import torch

        from hpckit.torch import save_state

        checkpoint = save_state({"state": torch.from_numpy(state),
                                 "momentum": torch.from_numpy(momentum), "epoch": epoch},
                                f"shard-rank{rank}.pt")
        hpckit.report(metrics, checkpoint=checkpoint, checkpoint_upload_mode="async")
        return
    if mode == "upload-async":
        at = Checkpoint(hpckit.get_context().get_experiment_path(),
                        hpckit.get_context().get_storage_filesystem())
        hpckit.report(metrics, checkpoint=at, checkpoint_upload_mode="async",
                      checkpoint_upload_fn=uploading(rank, epoch, state, momentum))
        return
    if mode.startswith("in-place"):
        d = hpckit.get_context().get_checkpoint_dir()
        save(d, rank, epoch, state, momentum)
        hpckit.report(metrics, checkpoint=Checkpoint.from_directory(d),
                      checkpoint_upload_mode="async" if mode.endswith("async") else "sync")
        return
    with tempfile.TemporaryDirectory() as d:
        save(d, rank, epoch, state, momentum)
        hpckit.report(metrics, checkpoint=Checkpoint.from_directory(d),
                      checkpoint_upload_mode=mode, validation=validation)


def uploading(rank: int, epoch: int, state, momentum):
    """report(checkpoint_upload_fn=...): this rank's files written straight into the
    checkpoint's directory on the experiment's storage (local or S3), on hpckit's thread."""
    def upload(checkpoint: Checkpoint, checkpoint_dir_name: str) -> Checkpoint:
        ctx = hpckit.get_context()
        storage = ctx.get_storage_filesystem()
        directory = f"{ctx.get_experiment_path()}/{checkpoint_dir_name}"
        storage.create_dir(directory, recursive=True)
        with tempfile.TemporaryDirectory() as d:
            save(d, rank, epoch, state, momentum)
            for name in sorted(os.listdir(d)):
                with open(os.path.join(d, name), "rb") as f, \
                        storage.open_output_stream(f"{directory}/{name}") as out:
                    out.write(f.read())
        return Checkpoint(directory, storage)
    return upload


def save(d: str, rank: int, epoch: int, state, momentum) -> None:
    np.save(os.path.join(d, f"state-rank{rank}.npy"), state)
    np.save(os.path.join(d, f"momentum-rank{rank}.npy"), momentum)
    if rank == 0:
        with open(os.path.join(d, "meta.json"), "w") as f:
            json.dump({"epoch": epoch}, f)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--storage", default=None, help="default: $HPCKIT_STORAGE")
    p.add_argument("--name", default="exp")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--epoch-seconds", type=float, default=0.0)
    p.add_argument("--shard-floats", type=int, default=4096)
    p.add_argument("--keep", type=int, default=2)
    p.add_argument("--no-verify", action="store_true")
    p.add_argument("--mirror", default=None)
    p.add_argument("--mirror-command", default=None)
    p.add_argument("--sync-period", type=float, default=300.0)
    p.add_argument("--artifacts", choices=["off", "rank0", "all"], default="off")
    p.add_argument("--mode", choices=["sync", "async", "in-place", "in-place-async", "save-state",
                                       "upload-async"], default="sync")
    p.add_argument("--every", type=int, default=1, help="checkpoint every N epochs")
    p.add_argument("--in-flight", type=int, default=1)
    p.add_argument("--topology", action="store_true", help="each rank prints PLACE {json} END")
    p.add_argument("--cache", default=None, help="CheckpointConfig(cache_dir)")
    p.add_argument("--persist-every", type=int, default=1)
    p.add_argument("--redundancy", default=None)
    p.add_argument("--stop-at", type=int, default=-1, help="rank 0 gets SIGUSR2 at this epoch")
    p.add_argument("--validate", action="store_true", help="every 4th checkpoint is validated")
    p.add_argument("--workers", type=int, default=None,
                   help="ranks (default: the launcher's); under plain python hpckit starts them")
    args = p.parse_args()
    trainer = DataParallelTrainer(
        train_loop,
        train_loop_config={"epochs": args.epochs, "epoch_seconds": args.epoch_seconds,
                           "shard_floats": args.shard_floats, "artifacts": args.artifacts,
                           "mode": args.mode, "every": args.every,
                           "topology": args.topology, "stop_at": args.stop_at,
                           "validate": args.validate},
        scaling_config=ScalingConfig(num_workers=args.workers or MPI.COMM_WORLD.size),
        run_config=RunConfig(name=args.name, storage_path=args.storage,
                             sync_config=SyncConfig(
                                 sync_artifacts=args.artifacts != "off",
                                 sync_artifacts_all_ranks=args.artifacts == "all",
                                 mirror=args.mirror, mirror_command=args.mirror_command,
                                 sync_period=args.sync_period),
                             checkpoint_config=CheckpointConfig(
                                 num_to_keep=args.keep, verify_on_resume=not args.no_verify,
                                 max_checkpoints_in_flight=args.in_flight, cache_dir=args.cache,
                                 persist_every=args.persist_every,
                                 redundancy=args.redundancy)),
        validation_config=ValidationConfig(validate) if args.validate else None)
    try:
        trainer.fit()
    except hpckit.HpckitError as exc:  # each rank says that its fit() raised (rank 0 prints it)
        # One write, newline included: unbuffered, print() writes the newline apart, and the
        # other rank's line can land between the two.
        sys.stdout.write(f"RAISED {type(exc).__name__}: {str(exc).splitlines()[0]}\n")
        sys.stdout.flush()
        raise


if __name__ == "__main__":
    main()

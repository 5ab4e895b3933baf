"""Ray 2.60's checkpoint validation, as a Ray program writes it: rank 0 checkpoints every
epoch and reports it with ``validation=...``; the trainer's ``ValidationConfig.fn`` reads
the checkpoint, takes ``--validate-seconds``, logs the call to ``fn_kwargs["log"]`` and
returns ``val_score``, by which retention keeps the best two. ``--faulty`` makes epoch 1's
validation raise and epoch 2's outlast its time limit; ``--sbatch partition=P`` makes each
validation a Slurm job, and ``--validation-ranks N`` sets the last N ranks aside to
validate. Rank 0 prints ``LOOP {seconds}`` (the training function's own time) and
``FINAL {json}`` (the result and every kept checkpoint's status). No torch: DataParallelTrainer."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import hpckit
from hpckit import (
    Checkpoint,
    CheckpointConfig,
    DataParallelTrainer,
    RunConfig,
    ScalingConfig,
    ValidationConfig,
    ValidationTaskConfig,
)


def val_score(epoch: int) -> float:
    """Odd epochs validate best: not the order of the training loss, which falls."""
    return float(epoch + 10 * (epoch % 2))


def validate(checkpoint: Checkpoint, log: str, seconds: float, mode: str = "ok") -> dict:
    with checkpoint.as_directory() as d, open(os.path.join(d, "state.json")) as f:
        epoch = json.load(f)["epoch"]
    with open(log, "a") as f:
        f.write(f"{os.path.basename(checkpoint.path)} {os.getpid()} "
                f"{os.environ.get('SLURM_JOB_ID', '-')} {os.getppid()}\n")
    if mode == "raise":
        raise RuntimeError(f"validation of epoch {epoch} failed on purpose")
    time.sleep(seconds * (20 if mode == "slow" else 1))
    return {"val_score": val_score(epoch), "validated_epoch": epoch}


def train_loop(config: dict) -> None:
    ctx = hpckit.get_context()
    began = time.perf_counter()
    start = 0
    if checkpoint := hpckit.get_checkpoint():
        with checkpoint.as_directory() as d, open(os.path.join(d, "state.json")) as f:
            start = json.load(f)["epoch"] + 1
    for epoch in range(start, config["epochs"]):
        time.sleep(config["epoch_seconds"])
        with tempfile.TemporaryDirectory() as d:
            checkpoint = None
            if ctx.get_world_rank() == 0:
                with open(os.path.join(d, "state.json"), "w") as f:
                    json.dump({"epoch": epoch}, f)
                checkpoint = Checkpoint.from_directory(d)
            hpckit.report({"epoch": epoch, "loss": 100.0 - epoch}, checkpoint=checkpoint,
                          validation=_validation(config, epoch) if checkpoint else False)
    if ctx.get_world_rank() == 0:
        print(f"LOOP {time.perf_counter() - began:.3f}", flush=True)
    if config["wait"] and ctx.get_world_rank() == 1:  # any rank may ask, as in Ray
        reported = hpckit.get_all_reported_checkpoints(timeout_s=120)
        print("REPORTED " + json.dumps([(os.path.basename(r.checkpoint.path), r.status.value,
                                         r.metrics.get("val_score")) for r in reported]),
              flush=True)


def _validation(config: dict, epoch: int) -> bool | ValidationTaskConfig:
    if not config["validate"]:
        return False
    if config["faulty"] and epoch == 1:  # no time limit: a loaded machine's start can take 2 s
        return ValidationTaskConfig(fn_kwargs={"mode": "raise"})
    if config["faulty"] and epoch == 2:
        return ValidationTaskConfig(fn_kwargs={"mode": "slow"}, timeout_s=config["timeout"])
    return True


def _column(table, name: str) -> list | None:
    return table.column(name).to_pylist() if name in table.column_names else None


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--storage", required=True)
    p.add_argument("--name", default="val")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--epoch-seconds", type=float, default=0.5)
    p.add_argument("--validate-seconds", type=float, default=None)
    p.add_argument("--faulty", action="store_true")
    p.add_argument("--timeout", type=float, default=2.0, help="timeout_s of --faulty's slow one")
    p.add_argument("--wait", action="store_true", help="rank 1 waits for the validations")
    p.add_argument("--validation-ranks", type=int, default=0,
                   help="the last N launched ranks validate instead of training")
    p.add_argument("--sbatch", action="append", default=[], metavar="KEY=VALUE",
                   help="validate each checkpoint in a Slurm job with these sbatch options")
    args = p.parse_args()
    from mpi4py import MPI

    log = os.path.join(args.storage, f"{args.name}-validations.log")
    validation = None
    if args.validate_seconds is not None:
        validation = ValidationConfig(validate, ValidationTaskConfig(
            fn_kwargs={"log": log, "seconds": args.validate_seconds}),
            ranks=args.validation_ranks,
            sbatch=dict(o.split("=", 1) for o in args.sbatch) if args.sbatch else None)
    print(f"PID {MPI.COMM_WORLD.rank} {os.getpid()}", flush=True)
    result = DataParallelTrainer(
        train_loop, train_loop_config={"epochs": args.epochs, "epoch_seconds": args.epoch_seconds,
                                       "validate": validation is not None, "faulty": args.faulty,
                                       "wait": args.wait, "timeout": args.timeout},
        scaling_config=ScalingConfig(num_workers=MPI.COMM_WORLD.size - args.validation_ranks),
        run_config=RunConfig(name=args.name, storage_path=args.storage,
                             checkpoint_config=CheckpointConfig(
                                 num_to_keep=2, checkpoint_score_attribute="val_score")),
        validation_config=validation).fit()
    if MPI.COMM_WORLD.rank >= MPI.COMM_WORLD.size - args.validation_ranks:
        print(f"SERVED {MPI.COMM_WORLD.rank} {len(result.best_checkpoints)}", flush=True)
    if MPI.COMM_WORLD.rank == 0:
        print("FINAL " + json.dumps({
            "best": [(os.path.basename(c.path), m) for c, m in result.best_checkpoints],
            "metrics": result.metrics,
            "history": [m.get("val_score") for m in result.metrics_history],
            "frame": _column(result.metrics_dataframe, "val_score")}), flush=True)


if __name__ == "__main__":
    main()

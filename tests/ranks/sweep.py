"""A small sweep: a grid over ``lr`` times a drawn ``shift``, three steps per trial, each
step a checkpoint. ``--fail-lr X`` makes the trials with that lr fail at their second step;
``--fail-once-lr X`` only in an attempt that started from scratch (a restart from the first
checkpoint goes on); ``--refuse-lr X`` reports metrics that are no JSON there (a
MetricsError, which a restart would meet again);
$HOLD_LR=X makes them wait there until killed (not a param: a rerun without it is the same
sweep); $STEP_SECONDS makes every step take that long. ``--samples N`` repeats the grid N times, ``--grid``
names its lr values. Each report says the host it ran on. ``--ranks 2``
runs each trial on two ranks (a DataParallelTrainer); one rank otherwise (a function).
``--mlflow URI`` logs each trial to MLflow (``MLflowLoggerCallback``)."""

from __future__ import annotations

import argparse
import json
import os
import socket
import tempfile
import time

import hpckit
from hpckit import tune


def train_fn(config: dict) -> None:
    start = 0
    if checkpoint := tune.get_checkpoint():
        with open(os.path.join(checkpoint.path, "step")) as f:
            start = int(f.read()) + 1
    rank = tune.get_context().get_world_rank()
    for step in range(start, 3):
        if step == 1 and config["lr"] == config["fail_lr"]:
            raise ValueError(f"lr {config['lr']} diverged")
        if step == 1 and start == 0 and config["lr"] == config["fail_once_lr"]:
            raise ValueError(f"lr {config['lr']} diverged once")
        if step == 1 and config["lr"] == config["refuse_lr"]:
            tune.report({"score": object()})
        if step == 1 and str(config["lr"]) == os.environ.get("HOLD_LR"):
            print(f"HOLDING pid {os.getpid()}", flush=True)
            time.sleep(600)
        time.sleep(float(os.environ.get("STEP_SECONDS", "0")))
        with tempfile.TemporaryDirectory() as d:
            checkpoint = None
            if rank == 0:
                with open(os.path.join(d, "step"), "w") as f:
                    f.write(str(step))
                checkpoint = hpckit.Checkpoint.from_directory(d)
            tune.report({"score": config["lr"] * (step + 1) + config["shift"], "step": step,
                         "ranks": tune.get_context().get_world_size(),
                         "leader": int(os.environ.get("PMI_RANK", "0")),
                         "host": socket.gethostname()}, checkpoint=checkpoint)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--storage", required=True)
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--fail-lr", type=float, default=-1.0)
    p.add_argument("--fail-once-lr", type=float, default=-1.0)
    p.add_argument("--refuse-lr", type=float, default=-1.0)
    p.add_argument("--samples", type=int, default=1)
    p.add_argument("--grid", default="0.1,0.2,0.3", help="the lr values, comma-separated")
    p.add_argument("--max-failures", type=int, default=0)
    p.add_argument("--concurrent", type=int, default=None, help="max_concurrent_trials")
    p.add_argument("--stop", type=json.loads, default=None, help="RunConfig(stop=...), as JSON")
    p.add_argument("--mlflow", default=None, help="an MLflowLoggerCallback's tracking URI")
    args = p.parse_args()
    callbacks = []
    if args.mlflow:
        from hpckit.mlflow import MLflowLoggerCallback

        callbacks.append(MLflowLoggerCallback(tracking_uri=args.mlflow))
    space = {"lr": tune.grid_search([float(lr) for lr in args.grid.split(",")]), "shift": tune.uniform(0, 1),
             "fail_lr": args.fail_lr, "fail_once_lr": args.fail_once_lr,
             "refuse_lr": args.refuse_lr}
    trainable = train_fn if args.ranks == 1 else hpckit.DataParallelTrainer(
        train_fn, scaling_config=hpckit.ScalingConfig(num_workers=args.ranks))
    grid = tune.Tuner(trainable, param_space=space,
                      tune_config=tune.TuneConfig(metric="score", mode="max", seed=7,
                                                  num_samples=args.samples,
                                                  max_concurrent_trials=args.concurrent),
                      run_config=hpckit.RunConfig(
                          name="grid", storage_path=args.storage,
                          checkpoint_config=hpckit.CheckpointConfig(num_to_keep=2),
                          failure_config=hpckit.FailureConfig(max_failures=args.max_failures),
                          stop=args.stop, callbacks=callbacks)).fit()
    best = grid.get_best_result()
    if os.environ.get("PMI_RANK", "0") == "0":  # every rank has the grid; one prints it
        print("GRID " + json.dumps({
            "errors": grid.num_errors, "terminated": grid.num_terminated,
            "best": best.config["lr"], "configs": [r.config for r in grid],
            "metrics": [r.metrics for r in grid]}), flush=True)


if __name__ == "__main__":
    main()

"""A run kept by an experiment tracker: ``--steps`` reports of ``{"loss": 1/(step+1)}``, a
checkpoint every 3rd, under ``DataParallelTrainer`` on two ranks (torch is not the point) with
``FailureConfig``. ``--tracker mlflow|wandb`` adds that tracker's logger callback;
``--setup mlflow|wandb`` calls ``setup_mlflow``/``setup_wandb`` in the training function and
prints ``SETUP <run id>``. ``--kill STEP`` SIGKILLs rank 0 once when it reaches that step,
before its report; ``--fail`` raises at the last step instead of reporting it; ``--no-restart`` lets the run fail
(``hpckit resume`` continues it)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import tempfile

import hpckit
from hpckit import (
    Checkpoint,
    CheckpointConfig,
    DataParallelTrainer,
    FailureConfig,
    RunConfig,
    ScalingConfig,
)


def train(config: dict) -> None:
    step = 0
    if checkpoint := hpckit.get_checkpoint():
        with checkpoint.as_directory() as d, open(os.path.join(d, "step.json")) as f:
            step = json.load(f)["step"]
    if config["setup"] == "mlflow":
        from hpckit.mlflow import setup_mlflow

        mlflow = setup_mlflow(config={"lr": 0.1}, tracking_uri=config["uri"],
                              experiment_name=config["name"], create_experiment_if_not_exists=True)
        print("SETUP", mlflow.active_run().info.run_id, flush=True)
    elif config["setup"] == "wandb":
        from hpckit.wandb import setup_wandb

        print("SETUP", setup_wandb(config={"lr": 0.1}).id, flush=True)
    while step < config["steps"]:
        step += 1
        marker = os.path.join(config["markers"], f"killed-{step}")
        rank = hpckit.get_context().get_world_rank()
        if step == config["kill"] and rank == 0 and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        if config["fail"] and step == config["steps"]:
            raise RuntimeError("the last step fails")
        with tempfile.TemporaryDirectory() as d:
            checkpoint = None
            if step % 3 == 0:
                with open(os.path.join(d, "step.json"), "w") as f:
                    json.dump({"step": step}, f)
                checkpoint = Checkpoint.from_directory(d)
            hpckit.report({"loss": 1 / (step + 1), "nested": {"acc": step / 10}},
                          checkpoint=checkpoint)


def callbacks(args: argparse.Namespace) -> list:
    if args.tracker == "mlflow":
        from hpckit.mlflow import MLflowLoggerCallback

        return [MLflowLoggerCallback(tracking_uri=args.uri, experiment_name=args.name)]
    if args.tracker == "wandb":
        from hpckit.wandb import WandbLoggerCallback

        return [WandbLoggerCallback(project=args.name)]
    return []


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--storage", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--tracker", choices=["mlflow", "wandb", "none"], default="none")
    parser.add_argument("--setup", choices=["mlflow", "wandb", "none"], default="none")
    parser.add_argument("--uri", default=None)
    parser.add_argument("--kill", type=int, default=0)
    parser.add_argument("--fail", action="store_true")
    parser.add_argument("--no-restart", action="store_true")
    parser.add_argument("--markers", default=tempfile.gettempdir())
    args = parser.parse_args()
    DataParallelTrainer(
        train, train_loop_config={"steps": args.steps, "kill": args.kill, "fail": args.fail,
                                  "markers": args.markers, "setup": args.setup, "uri": args.uri,
                                  "name": args.name},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=args.storage, name=args.name, callbacks=callbacks(args),
                             failure_config=FailureConfig(
                                 max_failures=1 if args.kill and not args.no_restart else 0),
                             checkpoint_config=CheckpointConfig(num_to_keep=2)),
    ).fit()


if __name__ == "__main__":
    main()

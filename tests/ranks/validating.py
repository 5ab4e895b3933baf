"""Validations that meet rank 0's threads, one scenario per ``--case``, in a one-rank run of
``python validating.py`` (the validation processes re-run this file):

``slow-sbatch``  the first two checkpoints are validated as Slurm jobs by the ``sbatch`` first
                 on PATH; prints ``SECONDS [...]``, each report's duration
``unrecorded``   the validation puts a directory where the manifest must be replaced, while
                 the run reports metrics only; prints ``REPORTS n``, the reports made
``fails-once``   the first attempt fails while its validation runs; FailureConfig retries it
                 in this process; the validations log their starts to ``--log``
``caught``       2 ranks, each handing its own file; the first checkpoint's validation cannot
                 start (the ``sbatch`` on PATH, the only program there, is made unrunnable), and the loop catches the
                 CommitError of the report that tells it, where each rank hands a new file,
                 then hands that same file again; rank 0 prints ``CAUGHT message`` and
                 ``COMMITTED n``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time

import hpckit
from hpckit import (
    Checkpoint,
    DataParallelTrainer,
    FailureConfig,
    RunConfig,
    ValidationConfig,
    ValidationTaskConfig,
)


def scored(checkpoint: Checkpoint, log: str | None = None, seconds: float = 0.0) -> dict:
    """The validation: what the checkpoint holds (after ``seconds``), each start logged."""
    if log:
        with open(log, "a") as f:
            f.write(f"{os.path.basename(checkpoint.path)} {os.getpid()}\n")
    time.sleep(seconds)
    with checkpoint.as_directory() as d, open(os.path.join(d, "step")) as f:
        return {"val_score": float(f.read())}


def manifest_blocked(checkpoint: Checkpoint) -> dict:
    """An outcome that cannot be recorded: a directory where the manifest's replacement lands."""
    experiment = os.path.dirname(checkpoint.path)
    os.replace(os.path.join(experiment, "manifest.json"), os.path.join(experiment, "moved.json"))
    os.makedirs(os.path.join(experiment, "manifest.json", "in-the-way"))
    return {"val_score": 1.0}


def report_step(step: int, validation: bool) -> float:
    """A checkpoint holding ``step``; the seconds report() took."""
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "step"), "w") as f:
            f.write(str(step))
        began = time.perf_counter()
        hpckit.report({"step": step}, checkpoint=Checkpoint.from_directory(d),
                      validation=validation)
        return time.perf_counter() - began


def slow_sbatch(config: dict) -> None:
    seconds = [report_step(step, validation=step < 2) for step in range(4)]
    print(f"SECONDS {json.dumps(seconds)}", flush=True)


def unrecorded(config: dict) -> None:
    report_step(0, validation=True)
    for step in range(1, 600):  # metrics only: nothing else writes the manifest
        time.sleep(0.05)
        hpckit.report({"step": step})
        print(f"REPORTS {step + 1}", flush=True)


def hand_own(step: int, name: str, validation: bool = False) -> None:
    """Every rank hands a directory with a file of its own, ``name``-rank``r``."""
    rank = hpckit.get_context().get_world_rank()
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, f"{name}-rank{rank}"), "w") as f:
            f.write(str(step))
        hpckit.report({"step": step}, checkpoint=Checkpoint.from_directory(d),
                      validation=validation)


def caught(config: dict) -> None:
    rank = hpckit.get_context().get_world_rank()
    if rank == 0:  # found at the start, refused from now on
        os.chmod(shutil.which("sbatch"), 0o644)
    hand_own(0, "first", validation=True)
    time.sleep(2.0)  # the validator meets the failing sbatch meanwhile
    committed = 1
    for step in range(1, 4):
        try:
            hand_own(step, "later")
            committed += 1
        except hpckit.CommitError as exc:  # on every rank; rank 0 says so
            if rank == 0:
                print(f"CAUGHT {str(exc).splitlines()[0]}", flush=True)
    if rank == 0:
        print(f"COMMITTED {committed}", flush=True)


def fails_once(config: dict) -> None:
    first = hpckit.get_checkpoint() is None
    report_step(0 if first else 1, validation=True)
    if first:
        deadline = time.monotonic() + 60
        while not (os.path.exists(config["log"]) and open(config["log"]).read()):
            assert time.monotonic() < deadline, "the validation never started"
            time.sleep(0.05)
        raise RuntimeError("the first attempt fails while its validation runs")


CASES = {"slow-sbatch": (slow_sbatch, {"sbatch": {"partition": "any"}}),
         "unrecorded": (unrecorded, {}), "fails-once": (fails_once, {}),
         "caught": (caught, {"sbatch": {"partition": "any"}})}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--storage", required=True)
    p.add_argument("--case", choices=sorted(CASES), required=True)
    p.add_argument("--log", default=None)
    args = p.parse_args()
    train, options = CASES[args.case]
    fn = manifest_blocked if args.case == "unrecorded" else scored
    if args.case == "fails-once":  # slow enough to be running when its attempt fails
        options = {"task_config": ValidationTaskConfig(fn_kwargs={"log": args.log,
                                                                  "seconds": 3.0})}
    DataParallelTrainer(
        train, train_loop_config={"log": args.log},
        scaling_config=hpckit.ScalingConfig(num_workers=2 if args.case == "caught" else 1),
        run_config=RunConfig(name="e", storage_path=args.storage,
                             failure_config=FailureConfig(
                                 max_failures=int(args.case == "fails-once"))),
        validation_config=ValidationConfig(fn, **options)).fit()


if __name__ == "__main__":
    main()

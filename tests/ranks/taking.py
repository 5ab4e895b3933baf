"""What an asynchronous report() takes of a handed directory when something goes wrong
(#65): each scenario hands a directory of the user's and prints ``SEEN <name> <json>`` lines
on rank 0 (``SEEN`` from every rank where it names the rank) for the test to check.

    python taking.py SCENARIO --storage DIR --handed DIR [--workers N]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import hpckit
from hpckit import Checkpoint, DataParallelTrainer, RunConfig, ScalingConfig


def seen(name: str, value: object, every_rank: bool = False) -> None:
    rank = hpckit.get_context().get_world_rank()
    if every_rank or rank == 0:
        print(f"SEEN {name}{f'-{rank}' if every_rank else ''} {json.dumps(value)}", flush=True)


def tree(directory: str) -> dict[str, str]:
    """Every file under ``directory`` with its content, and every directory with its mode."""
    found = {}
    for parent, dirs, names in os.walk(directory):
        for name in dirs:
            path = os.path.join(parent, name)
            found[os.path.relpath(path, directory) + "/"] = oct(os.stat(path).st_mode & 0o7777)
        for name in names:
            path = os.path.join(parent, name)
            with open(path, "rb") as f:
                found[os.path.relpath(path, directory)] = f.read().decode(errors="replace")
    return found


def read_only(config: dict) -> None:
    """A pretrained backbone at 0444 in a 0555 folder, as a user without root has it, beside
    files hpckit may take."""
    handed = config["handed"]
    mine = Checkpoint.from_directory(handed) if hpckit.get_context().get_world_rank() == 0 else None
    hpckit.report({"n": 0}, mine, checkpoint_upload_mode="async")
    seen("after_report", tree(handed))
    hpckit.report({"n": 1})


def shared(config: dict) -> None:
    """Every rank writes its shard into one directory on the shared filesystem, and hands it."""
    from mpi4py import MPI

    rank = hpckit.get_context().get_world_rank()
    handed = config["handed"]
    with open(os.path.join(handed, f"model-rank={rank}.pt"), "wb") as f:
        f.write(bytes([rank]) * 1000)
    MPI.COMM_WORLD.Barrier()  # every shard written before any rank lists the directory
    hpckit.report({"n": 0}, Checkpoint.from_directory(handed), checkpoint_upload_mode="async")
    hpckit.report({"n": 1})


def refused_after(config: dict) -> None:
    """An ASYNC report persists a handed directory; the next report is refused (a name that
    is not UTF-8, the same Checkpoint object, whose directory ASYNC took, another directory
    under the name the checkpoint still in flight has, or a report that rank 0 alone makes
    while rank 1 returns)."""
    rank = hpckit.get_context().get_world_rank()
    checkpoint = Checkpoint.from_directory(config["handed"]) if rank == 0 else None
    named = "best" if config["again"] == "taken-name" else None
    hpckit.report({"n": 0}, checkpoint, checkpoint_upload_mode="async", checkpoint_dir_name=named)
    time.sleep(0.5)  # the background write is done; its commit waits for the next step
    if config["again"] == "miscounted":
        if rank == 0:
            hpckit.report({"n": 1})
    elif config["again"] == "same":
        hpckit.report({"n": 1}, checkpoint, checkpoint_upload_mode="async")
    elif config["again"] == "taken-name":
        other = os.path.join(config["storage"], "other")
        if rank == 0:
            os.makedirs(other)
            with open(os.path.join(other, "model.pt"), "wb") as f:
                f.write(b"y")
        hpckit.report({"n": 1}, Checkpoint.from_directory(other) if rank == 0 else None,
                      checkpoint_upload_mode="async", checkpoint_dir_name="best")
    else:
        bad = os.path.join(config["storage"], "bad")
        if rank == 0:
            os.makedirs(bad)
            with open(os.path.join(os.fsencode(bad), b"bad\xff.pt"), "wb") as f:
                f.write(b"x")
        hpckit.report({"n": 1}, Checkpoint.from_directory(bad) if rank == 0 else None,
                      checkpoint_upload_mode="async")


def failed_after_commit(config: dict) -> None:
    """The ranks fail just after rank 0 began committing an ASYNC report's checkpoint in the
    background, before any rank heard that it committed."""
    rank = hpckit.get_context().get_world_rank()
    hpckit.report({"n": 0}, Checkpoint.from_directory(config["handed"]) if rank == 0 else None,
                  checkpoint_upload_mode="async")
    time.sleep(0.5)  # the background write is done; its commit waits for the next step
    hpckit.report({"n": 1})  # rank 0 commits checkpoint_000000 off the collective
    raise RuntimeError("the training fails before the ranks hear of that commit")


def interrupted(config: dict) -> None:
    """Ctrl-C while the checkpoint of an ASYNC report is persisted but not committed."""
    rank = hpckit.get_context().get_world_rank()
    hpckit.report({"n": 0}, Checkpoint.from_directory(config["handed"]) if rank == 0 else None,
                  checkpoint_upload_mode="async")
    seen("handed_over", sorted(os.listdir(config["handed"])) if os.path.isdir(
        config["handed"]) else None)
    time.sleep(60)  # Ctrl-C comes meanwhile: the checkpoint commits at the next report only


def killed(config: dict) -> None:
    """Hands the directory; run again after a kill, says what it finds there first."""
    seen("at_start", tree(config["handed"]) if os.path.isdir(config["handed"]) else None)
    if hpckit.get_checkpoint() is None:
        rank = hpckit.get_context().get_world_rank()
        hpckit.report({"n": 0}, Checkpoint.from_directory(config["handed"]) if rank == 0
                      else None, checkpoint_upload_mode="async")
    hpckit.report({"n": 1})


SCENARIOS = {"read-only": read_only, "shared": shared, "refused-after": refused_after,
             "failed-after-commit": failed_after_commit, "interrupted": interrupted,
             "killed": killed}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("scenario", choices=sorted(SCENARIOS))
    p.add_argument("--storage", required=True)
    p.add_argument("--handed", required=True)
    p.add_argument("--workers", type=int, default=int(os.environ.get("PMI_SIZE", "1")))
    p.add_argument("--again", default="bad-name", choices=["bad-name", "same", "taken-name", "miscounted"])
    args = p.parse_args()
    config = {"handed": args.handed, "storage": args.storage, "again": args.again}
    try:
        DataParallelTrainer(SCENARIOS[args.scenario], train_loop_config=config,
                            scaling_config=ScalingConfig(num_workers=args.workers),
                            run_config=RunConfig(name="exp", storage_path=args.storage)).fit()
    except hpckit.HpckitError as exc:
        print(f"RAISED {type(exc).__name__}: {str(exc).splitlines()[0]}", flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()

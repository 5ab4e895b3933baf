"""What report() does with the directory it is handed, in each upload mode, on real ranks.
Each scenario prints ``SEEN <name> <json>`` lines on rank 0 for the test to check."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import hpckit
from hpckit import Checkpoint, CheckpointUploadMode, DataParallelTrainer, RunConfig, ScalingConfig
from hpckit.checkpoint import written_when


def seen(name: str, value: object) -> None:
    if hpckit.get_context().get_world_rank() == 0:
        print(f"SEEN {name} {json.dumps(value)}", flush=True)


def handed_dir(rank: int, content: bytes, parent: str) -> tuple[str, str]:
    d = tempfile.mkdtemp(dir=parent)
    path = os.path.join(d, f"part-{rank}.bin")
    with open(path, "wb") as f:
        f.write(content)
    return d, path


def modes(parent: str) -> None:
    """ASYNC moves what it may take, copies what it may not, and commits in order."""
    rank = hpckit.get_context().get_world_rank()
    d, path = handed_dir(rank, b"first" * 1000, parent)
    inode = os.stat(path).st_ino
    hpckit.report({"n": 0}, Checkpoint.from_directory(d), checkpoint_upload_mode="async")
    seen("moved_away", not os.path.exists(d))
    seen("latest_while_in_flight", hpckit.get_checkpoint() is None)
    d, path = handed_dir(rank, b"second" * 1000, parent)
    hpckit.report({"n": 1}, Checkpoint.from_directory(d),
                  checkpoint_upload_mode=CheckpointUploadMode.ASYNC,
                  delete_local_checkpoint_after_upload=False)
    kept = os.path.exists(path)
    with open(path, "wb") as f:  # rewritten at once, as torch.save to the same path does
        f.write(b"changed")
    seen("kept_and_rewritten", kept)
    latest = hpckit.get_checkpoint()
    seen("first_committed", latest is not None and latest.path.endswith("checkpoint_000000"))
    committed = os.path.join(latest.path, f"part-{rank}.bin") if latest else ""
    seen("first_not_copied", bool(committed) and os.stat(committed).st_ino == inode)
    hpckit.report({"n": 2})  # checkpoint_000001 is committed by now, or at the end


def in_place(parent: str) -> None:
    """Files written into get_checkpoint_dir() are committed where they are."""
    rank = hpckit.get_context().get_world_rank()
    d = hpckit.get_context().get_checkpoint_dir()
    seen("inside_experiment", os.path.dirname(d) == hpckit.get_context().get_experiment_path())
    path = os.path.join(d, f"part-{rank}.bin")
    with open(path, "wb") as f:
        f.write(bytes([rank]) * 5000)
    inode = os.stat(path).st_ino
    hpckit.report({"n": 0}, Checkpoint.from_directory(d),
                  checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD)
    latest = hpckit.get_checkpoint()
    seen("committed_in_place", latest is not None and os.stat(
        os.path.join(latest.path, f"part-{rank}.bin")).st_ino == inode)
    seen("next_dir", os.path.basename(hpckit.get_context().get_checkpoint_dir()))
    try:
        hpckit.report({"n": 1}, Checkpoint.from_directory(parent), checkpoint_upload_mode="no_upload")
    except hpckit.HpckitError as exc:
        seen("no_upload_elsewhere", str(exc).splitlines()[0])
    inside = os.path.join(hpckit.get_context().get_checkpoint_dir(), "sub")
    os.makedirs(inside, exist_ok=True)
    try:  # a synchronous report that failed leaves the run able to go on
        hpckit.report({"n": 2}, Checkpoint.from_directory(inside))
    except hpckit.HpckitError as exc:
        seen("inside_refused", "inside the pending checkpoint" in str(exc))
    hpckit.report({"n": 3})


def failing(parent: str) -> None:
    """A background persist that fails on one rank fails the next report on every rank."""
    ctx = hpckit.get_context()
    d = ctx.get_checkpoint_dir()
    with open(os.path.join(d, f"part-{ctx.get_world_rank()}.bin"), "wb") as f:
        f.write(b"x" * 100)

    def broken() -> None:
        if ctx.get_world_rank() == ctx.get_world_size() - 1:
            raise OSError(28, "No space left on device")

    checkpoint = written_when(Checkpoint.from_directory(d), broken)
    hpckit.report({"n": 0}, checkpoint, checkpoint_upload_mode="async")
    time.sleep(0.5)  # an epoch of training: the background has failed by the next report
    try:
        hpckit.report({"n": 1})
    except hpckit.CommitError as exc:
        sys.stdout.write(f"RAISED rank={ctx.get_world_rank()} {str(exc).splitlines()[0]}\n")
        sys.stdout.flush()
        raise


def slow(parent: str) -> None:
    """Checkpoints slower to persist than the loop is to train: report() waits, said once."""
    ctx = hpckit.get_context()
    for n in range(4):
        d = ctx.get_checkpoint_dir()
        with open(os.path.join(d, f"part-{ctx.get_world_rank()}.bin"), "wb") as f:
            f.write(bytes([n]) * 100)
        checkpoint = written_when(Checkpoint.from_directory(d), lambda: time.sleep(0.3))
        hpckit.report({"n": n}, checkpoint, checkpoint_upload_mode="async")


def named(parent: str) -> None:
    """checkpoint_dir_name names the directory, sync or async; a name is used once."""
    ctx = hpckit.get_context()
    prefix = os.environ["NAME_PREFIX"]
    for n, mode in enumerate(["sync", "async", "sync"]):
        d, _ = handed_dir(ctx.get_world_rank(), b"n%d" % n, parent)
        hpckit.report({"n": n}, Checkpoint.from_directory(d), checkpoint_upload_mode=mode,
                      checkpoint_dir_name=f"{prefix}-epoch_{n}")
    seen("latest", os.path.basename(hpckit.get_checkpoint().path))
    d, _ = handed_dir(ctx.get_world_rank(), b"again", parent)
    try:
        hpckit.report({"n": 9}, Checkpoint.from_directory(d), checkpoint_dir_name=f"{prefix}-epoch_0")
    except hpckit.HpckitError as exc:
        seen("taken", "already exists" in str(exc))


def mixed(parent: str) -> None:
    """Rank 0 asks for async, the others for sync: the report is synchronous, and it waits for
    saves still being written (as an async DCP save's files are) before hashing them. As DCP's,
    the save ends together on every rank: once it returns, every rank's file is whole (a rank
    lists the shared directory, and hashes its share of what it finds, once its own save
    returned)."""
    from mpi4py import MPI

    ctx = hpckit.get_context()
    rank = ctx.get_world_rank()
    d = ctx.get_checkpoint_dir()
    import threading

    saves = MPI.COMM_WORLD.Dup()

    def late_write() -> None:  # on a thread of its own, as DCP's async_save writes
        time.sleep(0.3)
        with open(os.path.join(d, f"late-{rank}.bin"), "wb") as f:
            f.write(bytes([rank]) * 1000)
        saves.Barrier()

    saving = threading.Thread(target=late_write)
    saving.start()
    checkpoint = written_when(Checkpoint.from_directory(d), saving.join)
    hpckit.report({"n": 0}, checkpoint, checkpoint_upload_mode="async" if rank == 0 else "sync")
    seen("committed_at_once", hpckit.get_checkpoint() is not None)


def solo(parent: str) -> None:
    """Rank 0 hands a checkpoint ASYNC, the others report metrics only (no checkpoint, so no
    mode): the report is asynchronous, as in Ray, and a later report commits it."""
    rank = hpckit.get_context().get_world_rank()
    if rank == 0:
        d, _ = handed_dir(rank, b"solo" * 1000, parent)
        hpckit.report({"n": 0}, Checkpoint.from_directory(d), checkpoint_upload_mode="async")
    else:
        hpckit.report({"n": 0})
    seen("in_flight", hpckit.get_checkpoint() is None)
    hpckit.report({"n": 1})


def writers(parent: str) -> None:
    """An in-place checkpoint that rank 0 alone writes and hands, every rank hashing a share
    of its files; then one that every rank writes into and hands."""
    rank = hpckit.get_context().get_world_rank()
    d = hpckit.get_context().get_checkpoint_dir()
    if rank == 0:
        for name, size in (("model.pt", 3000), ("optim.pt", 2000), ("extra.json", 1000)):
            with open(os.path.join(d, name), "wb") as f:
                f.write(b"x" * size)
    hpckit.report({"n": 0}, Checkpoint.from_directory(d) if rank == 0 else None)
    d = hpckit.get_context().get_checkpoint_dir()
    with open(os.path.join(d, f"part-{rank}.bin"), "wb") as f:
        f.write(bytes([rank]) * 1000)
    hpckit.report({"n": 1}, Checkpoint.from_directory(d))


def rehand(parent: str) -> None:
    """Handing a committed checkpoint to an asynchronous report copies it: the committed one
    stays whole."""
    ctx = hpckit.get_context()
    d, _ = handed_dir(ctx.get_world_rank(), b"kept" * 100, parent)
    hpckit.report({"n": 0}, Checkpoint.from_directory(d))
    hpckit.report({"n": 1}, hpckit.get_checkpoint(), checkpoint_upload_mode="async")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("scenario", choices=["modes", "in_place", "failing", "slow", "named", "mixed", "solo",
                                         "rehand", "writers"])
    p.add_argument("--storage", required=True)
    p.add_argument("--handed", required=True, help="where the handed directories are made")
    args = p.parse_args()
    from mpi4py import MPI

    scenario = {"modes": modes, "in_place": in_place, "failing": failing, "slow": slow, "named": named,
                "mixed": mixed, "solo": solo, "rehand": rehand,
                "writers": writers}[args.scenario]
    DataParallelTrainer(lambda: scenario(args.handed),
                        scaling_config=ScalingConfig(num_workers=MPI.COMM_WORLD.size),
                        run_config=RunConfig(name=args.scenario, storage_path=args.storage)).fit()


if __name__ == "__main__":
    main()

"""Rank side of benchmarks/checkpoints.py: each mode prints raw samples as ``BENCH {json}``
lines from rank 0; the driver takes medians and ratios.

    mpiexec -n N python benchmarks/checkpoint_ranks.py MODE --storage DIR [--mib M] [--reps R]

Modes: ``blocking`` (report() per upload mode, and a raw write+fsync), ``job`` (the Ray
comparison workload with ``--checkpoints none|sync|async``), ``commit`` (a tiny sync
checkpoint beside a report without one) and ``dcp`` (hpckit's DCP save beside plain DCP).
torch is imported only by the modes that use it, so that 32 oversubscribed ranks start fast.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np
from mpi4py import MPI

import hpckit
from hpckit import Checkpoint, CheckpointConfig, DataParallelTrainer, RunConfig, ScalingConfig

BLOCKING_VARIANTS = ("sync", "async", "in_place", "in_place_async", "raw")
DCP_VARIANTS = ("hpckit_sync", "plain_sync", "hpckit_async", "plain_async")


def emit(**figures: object) -> None:
    if MPI.COMM_WORLD.rank == 0:
        print("BENCH " + json.dumps(figures), flush=True)


def barrier(comm: MPI.Comm) -> None:
    """A barrier that sleeps while it waits (busy-polling ranks would take the CPU that the
    other rank's hashing and copying need; the machine may have fewer cores than ranks)."""
    request = comm.Ibarrier()
    while not request.Test():
        time.sleep(0.0002)


def slowest(comm: MPI.Comm, samples: dict[str, list[float]]) -> dict[str, list[float]]:
    """Per sample, the slowest rank's value: data-parallel training waits for it."""
    every = comm.gather(samples, root=0)
    if comm.rank != 0:
        return {}
    return {key: [max(values) for values in zip(*(s[key] for s in every), strict=True)]
            for key in samples}


def blocking_step(variant: str, data: np.ndarray, config: dict, rep: int,
                  comm: MPI.Comm) -> tuple[float, float]:
    """One checkpoint of ``variant``: (the user's own write, the report() call) in seconds; a
    barrier between them keeps the ranks' write times out of report()."""
    ctx = hpckit.get_context()
    name = f"rank-{ctx.get_world_rank()}.bin"
    if variant == "raw":
        folder = os.path.join(ctx.get_experiment_path(), "raw", f"{rep}-{ctx.get_world_rank()}")
        shutil.rmtree(os.path.join(ctx.get_experiment_path(), "raw", f"{rep - 2}-{ctx.get_world_rank()}"),
                      ignore_errors=True)
        os.makedirs(folder)
        t = time.perf_counter()
        with open(os.path.join(folder, name), "wb") as f:
            data.tofile(f)
            f.flush()
            os.fsync(f.fileno())
        dir_fd = os.open(folder, os.O_RDONLY)
        os.fsync(dir_fd)
        os.close(dir_fd)
        return time.perf_counter() - t, 0.0
    in_place = variant.startswith("in_place")
    folder = ctx.get_checkpoint_dir() if in_place else tempfile.mkdtemp(dir=config["user_dir"])
    t = time.perf_counter()
    data.tofile(os.path.join(folder, name))
    wrote = time.perf_counter() - t
    barrier(comm)
    mode = "async" if variant.endswith("async") else "no_upload" if in_place else "sync"
    t = time.perf_counter()
    hpckit.report({"rep": rep}, checkpoint=Checkpoint.from_directory(folder), checkpoint_upload_mode=mode)
    reported = time.perf_counter() - t
    if not in_place:
        shutil.rmtree(folder, ignore_errors=True)
    return wrote, reported


def blocking(config: dict) -> None:
    """Each rank writes its share of ``mib`` of random bytes, then report() with each upload
    mode; ``raw`` writes and fsyncs the same bytes into the experiment. Each variant runs a
    block of ``block`` checkpoints, the first untimed, so that an async report() meets the
    previous async checkpoint to commit as in training; the order of the blocks rotates each
    repetition (interleaved); ``sleep`` stands for training between checkpoints."""
    comm = MPI.COMM_WORLD.Dup()
    size = (config["mib"] << 20) // comm.size
    data = np.random.default_rng(comm.rank).integers(0, 256, size, dtype=np.uint8)
    samples: dict[str, list[float]] = {f"{v}_{k}": [] for v in BLOCKING_VARIANTS
                                       for k in ("write", "report", "total")}
    steps = itertools.count()
    for rep in range(config["reps"]):
        shift = rep % len(BLOCKING_VARIANTS)
        for variant, k in itertools.product(BLOCKING_VARIANTS[shift:] + BLOCKING_VARIANTS[:shift],
                                             range(config["block"])):
            os.sync()  # no dirty pages from earlier steps: fsync must flush only this step's
            barrier(comm)
            t = time.perf_counter()
            wrote, reported = blocking_step(variant, data, config, next(steps), comm)
            barrier(comm)
            if k > 0:
                samples[f"{variant}_total"].append(time.perf_counter() - t)
                samples[f"{variant}_write"].append(wrote)
                samples[f"{variant}_report"].append(reported)
            time.sleep(config["sleep"])
    emit(mode="blocking", ranks=comm.size, mib=config["mib"], samples=slowest(comm, samples))


def job(config: dict) -> None:
    """benchmarks/workload.py's Ray workload, checkpointing as ``--checkpoints`` says."""
    import torch

    from hpckit.torch import prepare_model

    torch.manual_seed(0)
    model = prepare_model(torch.nn.Sequential(torch.nn.Linear(2048, 4096), torch.nn.Linear(4096, 2048)))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    ctx, mode, blocked, saved = hpckit.get_context(), config["checkpoints"], [], []
    started = time.perf_counter()
    for epoch in range(10):
        for _ in range(4):
            optimizer.zero_grad()
            loss = model(torch.randn(32, 2048)).pow(2).mean()
            loss.backward()
            optimizer.step()
        with tempfile.TemporaryDirectory() as d:
            checkpoint = None
            if mode != "none" and ctx.get_world_rank() == 0:
                t = time.perf_counter()
                torch.save({"model": model.state_dict(), "epoch": epoch}, os.path.join(d, "model.pt"))
                checkpoint = Checkpoint.from_directory(d)
                saved.append(time.perf_counter() - t)
            t = time.perf_counter()
            hpckit.report({"loss": loss.item(), "epoch": epoch}, checkpoint=checkpoint,
                          checkpoint_upload_mode="sync" if mode == "none" else mode)
            blocked.append(time.perf_counter() - t)
    emit(mode="job", checkpoints=mode, loop_s=time.perf_counter() - started, blocked_s=blocked,
         torch_save_s=saved)


class _Position:
    """A keeper of one number, standing for a prepared loader's position: every rank keeps
    a resume state, as a TorchTrainer's ranks do (their random streams)."""

    def __init__(self) -> None:
        self.at = 0

    def state_dict(self) -> int:
        return self.at

    def load_state_dict(self, state: int) -> None:
        self.at = state


def commit(config: dict) -> None:
    """A sync report() with a 4 KiB file per rank, interleaved with one without a checkpoint;
    then the files the last checkpoint created (each rank's, and the resume states' files:
    one a node)."""
    from hpckit.run.session.session import keep_loader

    keep_loader(_Position())
    comm = MPI.COMM_WORLD.Dup()
    data = np.random.default_rng(comm.rank).integers(0, 256, 4096, dtype=np.uint8)
    samples: dict[str, list[float]] = {"checkpoint": [], "no_checkpoint": []}
    for rep in range(-3, config["reps"]):  # three untimed warm-ups
        for variant in ("checkpoint", "no_checkpoint")[::1 if rep % 2 else -1]:
            barrier(comm)
            checkpoint = None
            if variant == "checkpoint":
                folder = tempfile.mkdtemp(dir=config["user_dir"])
                data.tofile(os.path.join(folder, f"rank-{comm.rank}.bin"))
                checkpoint = Checkpoint.from_directory(folder)
            t = time.perf_counter()
            hpckit.report({"rep": rep}, checkpoint=checkpoint)
            if rep >= 0:
                samples[variant].append(time.perf_counter() - t)
            if checkpoint is not None:
                shutil.rmtree(folder, ignore_errors=True)
    experiment = hpckit.get_context().get_experiment_path()
    with open(os.path.join(experiment, "manifest.json")) as f:
        latest = os.path.join(experiment, json.load(f)["latest"])
    created = [os.path.relpath(os.path.join(parent, name), latest)
               for parent, _, names in os.walk(latest) for name in names]
    emit(mode="commit", ranks=comm.size,
         manifest_bytes=os.path.getsize(os.path.join(experiment, "manifest.json")),
         samples=slowest(comm, samples), files_per_checkpoint=len(created),
         resume_state_files=sum(1 for name in created if name.startswith(".hpckit-resume")))


def dcp_state(mib: int) -> dict:
    """``mib`` of float32 weights sharded by rows over the ranks (a DTensor, as FSDP2 holds)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    full = torch.randn((mib << 20) // 4 // 1024, 1024, generator=torch.Generator().manual_seed(0))
    return {"model": {"weight": distribute_tensor(full, mesh, [Shard(0)])}, "step": 0}


def dcp_step(variant: str, state: dict, folder: str, group: object) -> tuple[float, float]:
    """One save: (blocking, until durable) in seconds; every rank returns after a barrier."""
    import torch.distributed.checkpoint as dcp

    from hpckit.torch import save_state_dcp

    t = time.perf_counter()
    if variant == "hpckit_sync":
        hpckit.report({"v": 0}, checkpoint=save_state_dcp(state))
    elif variant == "plain_sync":
        dcp.save(state, checkpoint_id=folder)
    elif variant == "hpckit_async":
        before = hpckit.get_checkpoint()
        hpckit.report({"v": 1}, checkpoint=save_state_dcp(state, async_=True), checkpoint_upload_mode="async")
        blocked = time.perf_counter() - t
        while hpckit.get_checkpoint() == before:  # the same on every rank: report is collective
            time.sleep(0.02)
            hpckit.report({"v": 1})
        return blocked, time.perf_counter() - t
    else:
        saving = dcp.async_save(state, checkpoint_id=folder, process_group=group)
        saving = getattr(saving, "upload_completion", saving)
        blocked = time.perf_counter() - t
        while not saving.done():
            time.sleep(0.02)
        saving.result()
        barrier(MPI.COMM_WORLD)
        return blocked, time.perf_counter() - t
    barrier(MPI.COMM_WORLD)
    spent = time.perf_counter() - t
    return spent, spent


def dcp_compare(config: dict) -> None:
    """hpckit's save_state_dcp + report beside torch's own dcp.save / async_save into the
    same filesystem, same state; the order of the four rotates each repetition."""
    import torch.distributed as dist

    comm, group = MPI.COMM_WORLD.Dup(), dist.new_group(backend="gloo")
    state = dcp_state(config["mib"])
    plain_root = os.path.join(hpckit.get_context().get_experiment_path(), "plain")
    samples: dict[str, list[float]] = {f"{v}_{k}": [] for v in DCP_VARIANTS for k in ("blocking", "durable")}
    for rep in range(config["reps"]):
        shift = rep % len(DCP_VARIANTS)
        for variant in DCP_VARIANTS[shift:] + DCP_VARIANTS[:shift]:
            folder = os.path.join(plain_root, f"{variant}-{rep}")
            if comm.rank == 0:
                shutil.rmtree(os.path.join(plain_root, f"{variant}-{rep - 2}"), ignore_errors=True)
            os.sync()
            barrier(comm)
            blocked, durable = dcp_step(variant, state, folder, group)
            samples[f"{variant}_blocking"].append(blocked)
            samples[f"{variant}_durable"].append(durable)
            time.sleep(config["sleep"])
    emit(mode="dcp", ranks=comm.size, mib=config["mib"], samples=slowest(comm, samples))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["blocking", "job", "commit", "dcp"])
    p.add_argument("--storage", required=True)
    p.add_argument("--name", required=True, help="the experiment's name: a fresh one for each run")
    p.add_argument("--user-dir", default=None, help="where the user's own checkpoint files go")
    p.add_argument("--mib", type=int, default=64)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--sleep", type=float, default=0.5, help="simulated training between reports")
    p.add_argument("--block", type=int, default=3, help="blocking: checkpoints per variant in a row")
    p.add_argument("--checkpoints", choices=["none", "sync", "async"], default="sync")
    args = p.parse_args()
    config = {"mib": args.mib, "reps": args.reps, "sleep": args.sleep, "checkpoints": args.checkpoints,
              "user_dir": args.user_dir, "block": args.block}
    keep = CheckpointConfig(num_to_keep=2)
    trainer_class = DataParallelTrainer
    if args.mode in ("job", "dcp"):
        from hpckit.torch import TorchTrainer

        trainer_class = TorchTrainer
    if args.mode == "job":
        keep = CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="loss",
                                checkpoint_score_order="min")
    loop = {"blocking": blocking, "job": job, "commit": commit, "dcp": dcp_compare}[args.mode]
    trainer = trainer_class(loop, train_loop_config=config,
                            scaling_config=ScalingConfig(num_workers=MPI.COMM_WORLD.size),
                            run_config=RunConfig(name=args.name, storage_path=args.storage,
                                                 checkpoint_config=keep))
    trainer.fit()


if __name__ == "__main__":
    sys.exit(main())

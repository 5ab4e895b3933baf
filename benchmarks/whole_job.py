"""The whole job, checkpointed as users write it, beside plain torch.distributed.

    python benchmarks/whole_job.py [--rounds 3] [--storage DIR] [--big-mib 1024]

The workload of issue #22: 2 ranks (mpiexec -n 2), a 64 MiB model (two linear layers) trained
with DDP over Gloo, 4 steps per epoch, a checkpoint of rank 0's model every epoch for 10
epochs, the whole command timed. Variants, interleaved in each round (the order rotates):

- ``ddp``: plain torch.distributed, no hpckit, no checkpoint (the limit);
- ``ddp-save``: the same with a hand-written rank-0 ``torch.save`` + fsync every epoch;
- ``hpckit-none``: hpckit, ``report(metrics)`` every epoch, no checkpoint;
- ``hpckit-sync``: rank 0 ``torch.save`` into a directory, ``report(..., checkpoint=...)``;
- ``hpckit-mixed-async``: as sync, rank 0 asks for ``ASYNC`` and rank 1 passes no mode
  (a Ray program's usual shape);
- ``hpckit-in-place-async``: rank 0 ``torch.save`` into ``get_checkpoint_dir()``, ``ASYNC``;
- ``hpckit-save-state``: rank 0 ``hpckit.torch.save_state`` (a copy into staging memory,
  written in the background), ``ASYNC``.

One JSON line per variant: median whole-job seconds, the ratio to ``ddp``, and rank 0's
median time blocked per checkpoint (its save plus report()). Then ``save_state`` and an
``ASYNC`` report() of ``--big-mib`` of CPU tensors, blocking time only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.abspath(__file__)
MPIEXEC = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or "mpiexec"
VARIANTS = ("ddp", "ddp-save", "hpckit-none", "hpckit-sync", "hpckit-mixed-async",
            "hpckit-in-place-async", "hpckit-save-state")
EPOCHS, STEPS = 10, 4


def model_and_optimizer():  # type: ignore[no-untyped-def]
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2048, 4096), torch.nn.Linear(4096, 2048))
    return model, torch.optim.SGD(model.parameters(), lr=1e-3)


def train_epoch(model, optimizer) -> float:  # type: ignore[no-untyped-def]
    import torch

    for _ in range(STEPS):
        optimizer.zero_grad()
        loss = model(torch.randn(32, 2048)).pow(2).mean()
        loss.backward()
        optimizer.step()
    return float(loss.item())


def plain_ddp(variant: str, storage: str, out: str) -> None:
    """torch.distributed without hpckit: the ranks and a port from MPI, Gloo, DDP."""
    import torch
    import torch.distributed as dist
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    port = comm.bcast(_free_port() if comm.rank == 0 else None)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=comm.rank,
                            world_size=comm.size)
    model, optimizer = model_and_optimizer()
    model = torch.nn.parallel.DistributedDataParallel(model)
    blocked = []
    for epoch in range(EPOCHS):
        train_epoch(model, optimizer)
        if variant == "ddp-save" and comm.rank == 0:
            started = time.perf_counter()
            with open(os.path.join(storage, f"plain-{epoch % 3}.pt"), "wb") as f:
                torch.save({"model": model.state_dict(), "epoch": epoch}, f)
                f.flush()
                os.fsync(f.fileno())
            blocked.append(time.perf_counter() - started)
    dist.destroy_process_group()
    if comm.rank == 0:
        _write(out, {"blocked": blocked, "report": []})


def hpckit_loop(config: dict) -> None:
    import torch

    import hpckit
    from hpckit.torch import prepare_model, save_state

    model, optimizer = model_and_optimizer()
    model = prepare_model(model)
    rank, variant, blocked, reports = hpckit.get_context().get_world_rank(), config["variant"], [], []
    for epoch in range(EPOCHS):
        loss = train_epoch(model, optimizer)
        metrics = {"loss": loss, "epoch": epoch}
        if variant == "hpckit-none" or rank != 0:
            hpckit.report(metrics)
            continue
        started = time.perf_counter()
        state = {"model": model.state_dict(), "epoch": epoch}
        mode = "async" if "async" in variant or "save-state" in variant else "sync"
        with tempfile.TemporaryDirectory() as own:
            directory = own if variant in ("hpckit-sync", "hpckit-mixed-async") \
                else hpckit.get_context().get_checkpoint_dir()
            if variant == "hpckit-save-state":
                checkpoint = save_state(state, "model.pt")
            else:
                torch.save(state, os.path.join(directory, "model.pt"))
                checkpoint = hpckit.Checkpoint.from_directory(directory)
            reporting = time.perf_counter()
            hpckit.report(metrics, checkpoint=checkpoint, checkpoint_upload_mode=mode)
            reports.append(time.perf_counter() - reporting)
        blocked.append(time.perf_counter() - started)
    if rank == 0:
        _write(config["out"], {"blocked": blocked, "report": reports})


def big_save(config: dict) -> None:
    """save_state of ``mib`` of CPU tensors, then an ASYNC report(), 2 s apart: rank 0's
    blocking in each (the first save allocates the staging memory)."""
    import torch

    import hpckit
    from hpckit.torch import save_state

    rank = hpckit.get_context().get_world_rank()
    tensors = {f"layer{i}": torch.randn(config["mib"] << 16) for i in range(4)}  # 4 x mib/4
    samples: dict[str, list[float]] = {"save_state": [], "report": []}
    for rep in range(config["reps"]):
        checkpoint = None
        if rank == 0:
            started = time.perf_counter()
            checkpoint = save_state(tensors, "big.pt")
            samples["save_state"].append(time.perf_counter() - started)
        started = time.perf_counter()
        hpckit.report({"rep": rep}, checkpoint=checkpoint, checkpoint_upload_mode="async")
        if rank == 0:
            samples["report"].append(time.perf_counter() - started)
        for t in tensors.values():
            t.add_(1.0)  # at once: the saved copy must not see it
        time.sleep(2.0)  # training between checkpoints: the write finishes in the background
    if rank == 0:
        with open(config["out"], "w") as f:
            json.dump(samples, f)


def worker(args: argparse.Namespace) -> None:
    if args.variant.startswith("ddp"):
        return plain_ddp(args.variant, args.storage, args.out)
    from hpckit import CheckpointConfig, RunConfig, ScalingConfig
    from hpckit.torch import TorchTrainer

    loop, config = hpckit_loop, {"variant": args.variant, "out": args.out}
    if args.variant == "big":
        loop, config = big_save, {"mib": args.big_mib // 4, "reps": 4, "out": args.out}
    TorchTrainer(loop, train_loop_config=config, scaling_config=ScalingConfig(num_workers=2),
                 run_config=RunConfig(name=args.name, storage_path=args.storage,
                                      checkpoint_config=CheckpointConfig(num_to_keep=2))).fit()


def run(variant: str, storage: str, big_mib: int) -> tuple[float, object]:
    name = f"{variant}-{time.time_ns()}"
    out = os.path.join(storage, f"{name}.json")
    command = [MPIEXEC, "-n", "2", sys.executable, HERE, "--worker", variant, "--storage", storage,
               "--name", name, "--out", out, "--big-mib", str(big_mib)]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "HPCKIT_LOG_LEVEL": "WARNING"})
    wall = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"failed: {' '.join(command)}\n{done.stdout}\n{done.stderr}")
    with open(out) as f:
        samples = json.load(f)
    shutil.rmtree(os.path.join(storage, name), ignore_errors=True)
    return wall, samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--storage", default=None)
    parser.add_argument("--big-mib", type=int, default=1024)
    parser.add_argument("--variants", default=None, help="a comma-separated subset (ddp is needed)")
    parser.add_argument("--worker", choices=[*VARIANTS, "big"], help=argparse.SUPPRESS)
    parser.add_argument("--name", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        args.variant = args.worker
        return worker(args)
    storage = args.storage or tempfile.mkdtemp(prefix="hpckit-whole-job-")
    variants = [v for v in VARIANTS if v in args.variants.split(",")] if args.variants else VARIANTS
    walls: dict[str, list[float]] = {v: [] for v in variants}
    blocked: dict[str, list[float]] = {v: [] for v in variants}
    reports: dict[str, list[float]] = {v: [] for v in variants}
    for round_ in range(args.rounds):
        shift = round_ % len(variants)
        for variant in variants[shift:] + variants[:shift]:
            wall, samples = run(variant, storage, args.big_mib)
            walls[variant].append(wall)
            blocked[variant].extend(samples["blocked"])  # type: ignore[index]
            reports[variant].extend(samples["report"])  # type: ignore[index]
    limit = statistics.median(walls["ddp"])
    for variant in variants:
        whole = statistics.median(walls[variant])
        print(json.dumps({
            "benchmark": "whole_job", "variant": variant, "rounds": args.rounds,
            "whole_job_s": round(whole, 3), "whole_job_all_s": [round(w, 3) for w in walls[variant]],
            "ratio_to_plain_ddp": round(whole / limit, 3),
            "blocked_per_checkpoint_ms": _median_ms(blocked[variant]),
            "report_per_checkpoint_ms": _median_ms(reports[variant]),
            "baseline": "ddp (plain torch.distributed, no checkpoint), same rounds"}), flush=True)
    _, samples = run("big", storage, args.big_mib)
    print(json.dumps({"benchmark": "save_state_blocking", "mib": args.big_mib, "reps": 4,
                      "save_state_ms": round(1000 * statistics.median(samples["save_state"]), 1),
                      "save_state_all_ms": [round(1000 * s, 1) for s in samples["save_state"]],
                      "async_report_ms": round(1000 * statistics.median(samples["report"]), 1),
                      "target_save_state_ms": 150, "target_report_ms": 5}), flush=True)
    if args.storage is None:
        shutil.rmtree(storage, ignore_errors=True)


def _median_ms(samples: list[float]) -> float | None:
    return round(1000 * statistics.median(samples), 1) if samples else None


def _write(path: str, samples: dict[str, list[float]]) -> None:
    with open(path, "w") as f:
        json.dump(samples, f)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


if __name__ == "__main__":
    main()

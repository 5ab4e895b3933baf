"""A training job whose behaviour the tests choose: shards, collisions, failures, hangs.

Run under mpiexec (or by hpckit itself with --workers); rank 0 prints one ``RESULT {json}``
line. The commit protocol it exercises does not involve torch, so by default it trains a NumPy
model under ``DataParallelTrainer`` (a rank starts in a fraction of a second); ``--torch``
trains with ``TorchTrainer``, DDP and ``prepare_data_loader`` where torch is what is tested.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

import hpckit
from hpckit import (
    Checkpoint,
    CheckpointConfig,
    DataParallelTrainer,
    FailureConfig,
    RunConfig,
    ScalingConfig,
)


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--storage", required=True)
    p.add_argument("--name", default="exp")
    p.add_argument("--workers", type=int, default=None, help="default: the launched world")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--checkpoint", choices=["rank0", "shards", "none", "all-same"], default="rank0")
    p.add_argument("--shard-bytes", type=int, default=1000)
    p.add_argument("--collide", choices=["identical", "different"], default=None)
    p.add_argument("--keep", type=int, default=None)
    p.add_argument("--score", default=None)
    p.add_argument("--order", default="max")
    p.add_argument("--fail-rank", type=int, default=None)
    p.add_argument("--fail-epoch", type=int, default=0)
    p.add_argument("--fail-attempts", type=int, default=1, help="fail in attempts below this")
    p.add_argument("--extra-report-rank", type=int, default=None)
    p.add_argument("--hang-rank", type=int, default=None)
    p.add_argument("--hang-epoch", type=int, default=0)
    p.add_argument("--hang-file", default=None)
    p.add_argument("--max-failures", type=int, default=0)
    p.add_argument("--resume-from", default=None)
    p.add_argument("--metrics", default="loss", help="'bad' reports a non-JSON metric")
    p.add_argument("--torch", action="store_true", help="TorchTrainer, DDP, prepare_data_loader")
    return p.parse_args(argv)


def write(path: str, size: int, fill: int) -> None:
    with open(path, "wb") as f:
        f.write(bytes([fill % 256]) * size)


def numpy_model(rank: int, size: int):
    """Linear regression by data-parallel SGD on NumPy: each rank its share of every epoch's
    shuffled batches, gradients averaged over the ranks. Returns one epoch's training."""
    from mpi4py import MPI

    data = np.random.default_rng(0)
    x, y = data.standard_normal((64, 4)), data.standard_normal(64)
    weights = np.zeros(4)

    def epoch_loss(epoch: int) -> float:
        nonlocal weights
        order = np.random.default_rng(epoch).permutation(64)
        total = 0.0
        for batch in np.array_split(order, 8):
            mine = batch[rank::size]
            error = x[mine] @ weights - y[mine]
            gradient = MPI.COMM_WORLD.allreduce(2 * x[mine].T @ error) / len(batch)
            weights = weights - 0.1 * gradient
            total += MPI.COMM_WORLD.allreduce(float(error @ error)) / len(batch)
        return total
    return epoch_loss


def torch_model(size: int):
    """DDP on torch: prepare_data_loader gives the ranks disjoint shares covering the data,
    reshuffled every epoch (checked here); prepare_model wraps a linear model. Returns one
    epoch's training."""
    import torch
    from mpi4py import MPI

    from hpckit.torch import prepare_data_loader, prepare_model

    ids = prepare_data_loader(torch.utils.data.DataLoader(range(40), batch_size=4, shuffle=True))
    epochs = [[int(i) for batch in ids for i in batch] for _ in range(2)]
    shares = MPI.COMM_WORLD.allgather(epochs)
    for e in range(2):
        seen = sorted(i for share in shares for i in share[e])
        assert set(seen) == set(range(40)) and len(seen) == 40 + (-40 % size), seen
    assert size == 1 or any(s[0] != s[1] for s in shares), "epochs were not reshuffled"
    torch.manual_seed(0)
    model = prepare_model(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    loader = prepare_data_loader(torch.utils.data.DataLoader(data, batch_size=8, shuffle=True))

    def epoch_loss(epoch: int) -> float:
        total = 0.0
        for x, y in loader:
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            total += loss.item()
        return total
    return epoch_loss


def train_loop(config: dict) -> None:
    args = argparse.Namespace(**config)
    ctx = hpckit.get_context()
    rank, size = ctx.get_world_rank(), ctx.get_world_size()
    # Every rank must agree on who is who (checked first: a collective of the test's own).
    from mpi4py import MPI
    views = MPI.COMM_WORLD.allgather((rank, size, ctx.get_local_rank(), ctx.get_local_world_size(),
                                      ctx.get_node_rank(), ctx.get_experiment_name()))
    assert sorted(v[0] for v in views) == list(range(size)), views
    assert sorted(v[2] for v in views) == list(range(size)), views
    assert all(v[1] == size == v[3] and v[4] == 0 and v[5] == views[0][5] for v in views), views
    if "://" not in args.storage:
        assert ctx.get_storage_path() == os.path.abspath(args.storage), ctx.get_storage_path()
        assert ctx.get_experiment_path() == os.path.join(os.path.abspath(args.storage), args.name)
    else:  # as in Ray: a path on the storage filesystem, no scheme, no credentials
        assert "://" not in ctx.get_experiment_path() and "@" not in ctx.get_experiment_path()
        assert ctx.get_experiment_path() == f"{ctx.get_storage_path()}/{args.name}"
    if os.environ.get("SLURM_JOB_ID"):
        assert ctx.get_slurm_info()["job_id"] == os.environ["SLURM_JOB_ID"]
    epoch_loss = torch_model(size) if args.torch else numpy_model(rank, size)
    start = 0
    ckpt = hpckit.get_checkpoint()
    if ckpt:
        with ckpt.as_directory() as d:
            start = json.load(open(os.path.join(d, "state.json")))["epoch"] + 1
    seen = []
    for epoch in range(start, args.epochs):
        total = epoch_loss(epoch)
        seen.append(epoch)
        if args.fail_rank == rank and args.fail_epoch == epoch and ctx.get_attempt() < args.fail_attempts:
            raise ValueError(f"injected failure on rank {rank} at epoch {epoch}")
        metrics = {"loss": total, "epoch": epoch, "score": [3, 1, 4, 1, 5, 9, 2, 6][epoch % 8]}
        if args.metrics == "bad":
            metrics["model"] = object()
        with tempfile.TemporaryDirectory() as d:
            checkpoint = None
            if args.checkpoint == "shards" or (args.checkpoint == "rank0" and rank == 0):
                write(os.path.join(d, f"model-rank={rank}.pt"), args.shard_bytes, rank)
                with open(os.path.join(d, "state.json"), "w") as f:
                    json.dump({"epoch": epoch}, f)
                checkpoint = Checkpoint.from_directory(d)
            if args.checkpoint == "all-same" or args.collide:
                with open(os.path.join(d, "state.json"), "w") as f:
                    json.dump({"epoch": epoch}, f)
                if args.collide:
                    fill = rank if args.collide == "different" else 7
                    write(os.path.join(d, "common.bin"), args.shard_bytes, fill)
                checkpoint = Checkpoint.from_directory(d)
            if args.hang_rank == rank and args.hang_epoch == epoch and ctx.get_attempt() == 0:
                with open(args.hang_file + ".tmp", "w") as f:
                    f.write(str(os.getpid()))
                os.replace(args.hang_file + ".tmp", args.hang_file)
                time.sleep(600)
            hpckit.report(metrics, checkpoint=checkpoint)
            if args.extra_report_rank == rank and epoch == args.epochs - 1:
                hpckit.report(metrics)
    if rank == 0:
        print(f"SEEN {json.dumps(seen)}", flush=True)


def main() -> None:
    args = parse(sys.argv[1:])
    workers = args.workers or int(os.environ.get("PMI_SIZE", "1"))
    if args.torch:
        from hpckit.torch import TorchTrainer as Trainer
    else:
        Trainer = DataParallelTrainer
    trainer = Trainer(
        train_loop, train_loop_config=vars(args),
        scaling_config=ScalingConfig(num_workers=workers),
        run_config=RunConfig(
            name=args.name, storage_path=args.storage,
            checkpoint_config=CheckpointConfig(num_to_keep=args.keep,
                                               checkpoint_score_attribute=args.score,
                                               checkpoint_score_order=args.order),
            failure_config=FailureConfig(max_failures=args.max_failures)),
        resume_from_checkpoint=Checkpoint(args.resume_from) if args.resume_from else None)
    try:
        result = trainer.fit()
    except hpckit.PreemptionError:
        raise  # a stopped run: uncaught, it exits 75 ("continue later")
    except hpckit.HpckitError as exc:
        failures = getattr(exc, "worker_failures", None)
        if failures is not None:  # as a Ray program reads WorkerGroupError
            print("FAILED " + json.dumps({str(r): type(e).__name__ for r, e in failures.items()}),
                  flush=True)
        print(f"ERROR {type(exc).__name__}: {exc}", flush=True)
        sys.exit(3)
    if int(os.environ.get("PMI_RANK", "0")) == 0:
        print("RESULT " + json.dumps({
            "metrics": result.metrics, "checkpoint": result.checkpoint and result.checkpoint.path,
            "best": [c.path for c, _ in result.best_checkpoints], "path": result.path,
            "history": result.metrics_history}), flush=True)


if __name__ == "__main__":
    main()

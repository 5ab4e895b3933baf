"""Workloads timed by benchmarks/core.py; each prints ``BENCH {json}`` lines from rank 0.

``--framework ray`` runs the same program on Ray Train (in the virtualenv that
benchmarks/ray_env.py makes): only the imports differ, as hpckit promises.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

T_START = time.perf_counter()
import torch  # noqa: E402

T_TORCH = time.perf_counter()


def chosen_framework(argv: list[str]) -> str:
    """Read before argparse runs, because the imports below depend on it."""
    for i, arg in enumerate(argv):
        if arg.startswith("--framework="):
            return arg.split("=", 1)[1]
        if arg == "--framework" and i + 1 < len(argv):
            return argv[i + 1]
    return "hpckit"


FRAMEWORK = chosen_framework(sys.argv)
if FRAMEWORK == "ray":
    from ray import train as api
    from ray.train import Checkpoint, CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer, prepare_model
else:
    import hpckit as api  # noqa: E402
    from hpckit import Checkpoint, CheckpointConfig, FailureConfig, RunConfig, ScalingConfig  # noqa: E402
    from hpckit.torch import TorchTrainer, prepare_model  # noqa: E402


def emit(**figures: object) -> None:
    if api.get_context().get_world_rank() == 0:
        print("BENCH " + json.dumps(figures), flush=True)


def report_empty(config: dict) -> None:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD.Dup()
    n = config["reports"]
    for _ in range(10):
        api.report({"loss": 1.0})
    times, base = [], []
    for i in range(n):
        t = time.perf_counter()
        api.report({"loss": 1.0 / (i + 1), "step": i})
        times.append(time.perf_counter() - t)
        t = time.perf_counter()
        comm.bcast(comm.gather({"loss": 1.0 / (i + 1), "step": i}, root=0), root=0)
        base.append(time.perf_counter() - t)
    emit(figure="report_no_checkpoint", ranks=comm.size, reports=n,
         median_ms=statistics.median(times) * 1e3, mean_ms=statistics.fmean(times) * 1e3,
         baseline="mpi gather+bcast of the same metrics",
         baseline_median_ms=statistics.median(base) * 1e3)


def report_checkpoint(config: dict) -> None:
    """Interleave report() and a raw write+fsync of the same bytes, alternating which goes
    first: VM disks swing between absorbing writes in a host cache and writing at disk speed,
    so only paired, interleaved samples compare fairly."""
    ctx = api.get_context()
    rank0 = ctx.get_world_rank() == 0
    data = os.urandom(config["mib"] << 20) if rank0 else b""
    ours, raw = [], []

    def persist(rep: int) -> None:
        with tempfile.TemporaryDirectory(dir=config["stage"]) as d:
            checkpoint = None
            if rank0:
                with open(os.path.join(d, "model.pt"), "wb") as f:
                    f.write(data)
                checkpoint = Checkpoint.from_directory(d)
            os.sync()  # no dirty pages from staging: fsync must not flush others' writes
            t = time.perf_counter()
            api.report({"rep": rep}, checkpoint=checkpoint)
            ours.append(time.perf_counter() - t)

    def write_raw(rep: int) -> None:
        if not rank0:
            return
        folder = os.path.join(ctx.get_experiment_path(), f"raw-{rep}")
        os.makedirs(folder)
        os.sync()
        t = time.perf_counter()
        with open(os.path.join(folder, "model.pt"), "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        raw.append(time.perf_counter() - t)

    for rep in range(config["reps"]):
        for step in ((persist, write_raw) if rep % 2 else (write_raw, persist)):
            step(rep)
    if rank0:
        o, r = statistics.median(ours), statistics.median(raw)
        emit(figure="report_checkpoint", ranks=ctx.get_world_size(), mib=config["mib"],
             reps=config["reps"], median_s=o, min_s=min(ours), mib_per_s=config["mib"] / o,
             baseline="python write+fsync of the same bytes, interleaved",
             baseline_median_s=r, baseline_min_s=min(raw), ratio_of_medians=o / r,
             ratio_of_minimums=min(ours) / min(raw), target_ratio=1.1,
             target_met=max(o / r, min(ours) / min(raw)) <= 1.1)


def first_step(config: dict) -> None:
    now = time.time()
    emit(figure="fit_to_first_step", fit_called=config["fit_called"], first_step=now)
    api.report({"loss": 0.0})


def ray_workload(config: dict) -> None:
    """2 ranks, a 64 MiB model checkpointed each of 10 epochs, top-2 by loss."""
    torch.manual_seed(0)
    model = prepare_model(torch.nn.Sequential(torch.nn.Linear(2048, 4096), torch.nn.Linear(4096, 2048)))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    ctx = api.get_context()
    start = 0
    ckpt = api.get_checkpoint()
    if ckpt:
        with ckpt.as_directory() as d:
            state = torch.load(os.path.join(d, "model.pt"), weights_only=True)
            model.load_state_dict(state["model"])
            start = state["epoch"] + 1
        fail_file = config.get("fail_file")
        if ctx.get_world_rank() == 0 and fail_file and os.path.exists(fail_file):
            with open(fail_file) as f:
                failed_at = float(f.read())
            emit(figure="recovery_after_worker_failure", failure_to_resumed_training_s=time.time() - failed_at,
                 resumed_from_epoch=start - 1)
    blocked = []
    for epoch in range(start, 10):
        for _ in range(4):
            x = torch.randn(32, 2048)
            optimizer.zero_grad()
            loss = model(x).pow(2).mean()
            loss.backward()
            optimizer.step()
        failing = config.get("fail_epoch") == epoch and not os.path.exists(config["fail_file"])
        if failing and ctx.get_world_rank() == 1:
            with open(config["fail_file"], "w") as f:
                f.write(str(time.time()))
            raise RuntimeError("injected worker failure")
        with tempfile.TemporaryDirectory() as d:
            checkpoint = None
            if ctx.get_world_rank() == 0:
                torch.save({"model": model.state_dict(), "epoch": epoch}, os.path.join(d, "model.pt"))
                checkpoint = Checkpoint.from_directory(d)
            t = time.perf_counter()
            api.report({"loss": loss.item(), "epoch": epoch}, checkpoint=checkpoint)
            blocked.append(time.perf_counter() - t)
    emit(figure="ray_workload_epochs", blocked_per_report_s=statistics.fmean(blocked))


def plain(storage: str) -> None:
    """The ray workload's compute and checkpoints in one process, with no framework at all."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2048, 4096), torch.nn.Linear(4096, 2048))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    for epoch in range(10):
        for _ in range(4):
            optimizer.zero_grad()
            model(torch.randn(32, 2048)).pow(2).mean().backward()
            optimizer.step()
        path = os.path.join(storage, f"plain-{epoch % 3}.pt")
        with open(path, "wb") as f:
            torch.save({"model": model.state_dict(), "epoch": epoch}, f)
            f.flush()
            os.fsync(f.fileno())


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["report-empty", "report-checkpoint", "first-step", "ray",
                                    "ray-fail", "plain"])
    p.add_argument("--storage", required=True)
    p.add_argument("--workers", type=int, default=int(os.environ.get("PMI_SIZE", "1")))
    p.add_argument("--reports", type=int, default=300)
    p.add_argument("--mib", type=int, default=64)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--framework", choices=["hpckit", "ray"], default="hpckit",
                   help="the same program on hpckit or on Ray Train (its imports chosen above)")
    args = p.parse_args()
    if args.mode == "plain":
        return plain(args.storage)
    name = f"{args.mode}-{args.workers}-{args.mib}-{args.framework}"
    loops = {"report-empty": report_empty, "report-checkpoint": report_checkpoint,
             "first-step": first_step, "ray": ray_workload, "ray-fail": ray_workload}
    config = {"reports": args.reports, "mib": args.mib, "reps": args.reps,
              "stage": args.storage, "fit_called": None}
    keep = CheckpointConfig()
    failures = FailureConfig()
    if args.mode.startswith("ray"):
        keep = CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="loss",
                                checkpoint_score_order="min")
    if args.mode == "ray-fail":
        config.update(fail_epoch=5, fail_file=os.path.join(args.storage, f"{name}-failed-at"))
        failures = FailureConfig(max_failures=1)
        if os.path.exists(config["fail_file"]):
            os.remove(config["fail_file"])
    trainer = TorchTrainer(loops[args.mode], train_loop_config=config,
                           scaling_config=ScalingConfig(num_workers=args.workers),
                           run_config=RunConfig(name=name, storage_path=args.storage,
                                                checkpoint_config=keep, failure_config=failures))
    config["fit_called"] = time.time()
    started = time.perf_counter()
    trainer.fit()
    if args.mode.startswith("ray") and int(os.environ.get("PMI_RANK", "0")) == 0:
        print("BENCH " + json.dumps({"figure": "ray_workload_fit", "fit_s": time.perf_counter() - started,
                                     "import_torch_s": T_TORCH - T_START}), flush=True)


if __name__ == "__main__":
    sys.exit(main())

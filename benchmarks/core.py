"""Core benchmarks: JSON lines, each figure beside a baseline measured in the same run.

    python benchmarks/core.py [--storage DIR] [--quick] [--no-ray]

Figures: fit() to the first training step (beside the time to import torch); report()
without a checkpoint at 2 and 4 ranks (beside a bare MPI gather+bcast); report() with a
64 MiB and a 1 GiB rank-0 checkpoint (beside Python writing and fsyncing the same bytes);
the Ray Train comparison workload (beside the same compute with no framework, and beside
the same program on Ray Train 2.60, see ray_env.py), the time to recover from a worker
failure, and the checksum verification a resume does (beside reading
the same bytes without hashing them, and beside persisting them).
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

from ray_env import RAY_VERSION, ray_python
from scratch import scratch_storage

HERE = os.path.dirname(os.path.abspath(__file__))
WORKLOAD = os.path.join(HERE, "workload.py")
MPIEXEC = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or "mpiexec"


def emit(**figures: object) -> None:
    print(json.dumps(figures), flush=True)


def bench_lines(command: list[str], timeout: float = 600) -> tuple[list[dict], float]:
    started = time.perf_counter()
    out = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                         env={**os.environ, "HPCKIT_LOG_LEVEL": "WARNING"})
    wall = time.perf_counter() - started
    if out.returncode != 0:
        sys.exit(f"benchmark command failed: {' '.join(command)}\n{out.stdout}\n{out.stderr}")
    lines = [json.loads(l.split("BENCH ", 1)[1]) for l in out.stdout.splitlines() if "BENCH " in l]
    return lines, wall


def timed(command: list[str], repeat: int = 3) -> float:
    walls = []
    for _ in range(repeat):
        started = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True)
        walls.append(time.perf_counter() - started)
    return statistics.median(walls)


def ranks(n: int, *args: str) -> list[str]:
    return [MPIEXEC, "-n", str(n), sys.executable, WORKLOAD, *args]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--storage", default=None, help="where checkpoints go (default: a temp dir)")
    parser.add_argument("--quick", action="store_true", help="skip the 1 GiB checkpoint")
    parser.add_argument("--no-ray", action="store_true",
                        help="skip Ray Train's side (which needs a virtualenv made on first use)")
    args = parser.parse_args()
    ray = None if args.no_ray else ray_python()
    with scratch_storage(args.storage, "hpckit-bench-") as storage:
        run_all(storage, args.quick, ray)


def on_ray(ray: str | None, storage: str, mode: str) -> tuple[list[dict], float]:
    """The workload run again on Ray Train 2.60, the same program with Ray's imports."""
    if ray is None:
        return [], 0.0
    return bench_lines([ray, WORKLOAD, mode, "--framework", "ray", "--storage", storage,
                        "--workers", "2"])


def figure(lines: list[dict], name: str) -> dict:
    return next((line for line in lines if line["figure"] == name), {})


def run_all(storage: str, quick: bool, ray: str | None) -> None:
    py = sys.executable
    startup = timed([py, "-c", "pass"])
    torch_import = timed([py, "-c", "import torch"])
    emit(figure="baseline_import_torch", python_start_s=startup, import_torch_s=torch_import)

    (line,), _ = bench_lines(ranks(2, "first-step", "--storage", storage))
    seconds = line["first_step"] - line["fit_called"]
    emit(figure="fit_to_first_step", launch="mpiexec -n 2", seconds=seconds,
         baseline="already imported torch in each rank", target_s=1.5, target_met=seconds <= 1.5)
    (line,), wall = bench_lines([py, WORKLOAD, "first-step", "--storage", storage, "--workers", "2"])
    spent = line["first_step"] - line["fit_called"]
    ray_first = figure(on_ray(ray, storage, "first-step")[0], "fit_to_first_step")
    emit(figure="fit_to_first_step", launch="python train.py (hpckit starts 2 ranks)", seconds=spent,
         beyond_import_torch_s=spent - torch_import, baseline_import_torch_s=torch_import,
         target_beyond_s=1.5, target_met=spent - torch_import <= 1.5,
         ray_train_2_60_s=ray_first and ray_first["first_step"] - ray_first["fit_called"])

    for n in (2, 4):
        (line,), _ = bench_lines(ranks(n, "report-empty", "--storage", storage, "--reports", "300"))
        emit(**line, target_ms=5.0, target_met=line["median_ms"] <= 5.0)

    sizes = [(64, 11)] + ([] if quick else [(1024, 3)])
    for mib, reps in sizes:
        (line,), _ = bench_lines(ranks(2, "report-checkpoint", "--storage", storage, "--mib",
                                       str(mib), "--reps", str(reps)))
        emit(**line)

    for mib, _ in sizes:
        bench_verify(storage, mib)

    plain_wall = timed([py, WORKLOAD, "plain", "--storage", storage], repeat=1)
    lines, wall = bench_lines([py, WORKLOAD, "ray", "--storage", storage, "--workers", "2"])
    epochs = figure(lines, "ray_workload_epochs")
    ray_lines, ray_wall = on_ray(ray, storage, "ray")
    ray_side = {"whole_job_s": ray_wall,
                "blocked_per_report_s": figure(ray_lines, "ray_workload_epochs").get("blocked_per_report_s")}
    emit(figure="ray_train_workload", description="2 ranks, 64 MiB model, checkpoint each of 10 "
         "epochs, top-2 by loss, python train.py", whole_job_s=wall,
         blocked_per_report_s=epochs["blocked_per_report_s"],
         baseline="same compute and torch.save+fsync in one process, no framework",
         baseline_whole_job_s=plain_wall, ray_train_2_60=ray_side if ray else None,
         ray_train_version=RAY_VERSION if ray else None)

    lines, wall = bench_lines([py, WORKLOAD, "ray-fail", "--storage", storage, "--workers", "2"])
    recovery = figure(lines, "recovery_after_worker_failure")
    ray_recovery = figure(on_ray(ray, storage, "ray-fail")[0], "recovery_after_worker_failure")
    emit(**recovery, whole_job_with_one_failure_s=wall,
         ray_train_2_60_s=ray_recovery.get("failure_to_resumed_training_s"))


def bench_verify(storage: str, mib: int, files: int = 4) -> None:
    """Verification on resume re-reads and hashes every file of the newest checkpoint."""
    from hpckit.experiment import verify as _verify
    from hpckit.storage import copy as _copy
    from hpckit.experiment.manifest import CheckpointRecord, FileRecord
    from hpckit.storage.location import resolve

    experiment = resolve(tempfile.mkdtemp(prefix="verify-bench-", dir=storage))
    source = tempfile.mkdtemp(prefix="verify-source-", dir=storage)
    records, persist_s = [], 0.0
    for i in range(files):
        path = os.path.join(source, f"shard-{i}.bin")
        with open(path, "wb") as f:
            for _ in range(mib // files // 8 or 1):
                f.write(os.urandom(8 << 20))
        started = time.perf_counter()
        size, digest = _copy.persist_file(path, experiment.join("checkpoint_000000", f"shard-{i}.bin"))
        persist_s += time.perf_counter() - started
        records.append(FileRecord(f"shard-{i}.bin", size, 0, digest))
    record = CheckpointRecord(0, "checkpoint_000000", 0, time.time(), {}, tuple(records))
    started = time.perf_counter()
    for f in records:
        with open(os.path.join(experiment.path, "checkpoint_000000", f.path), "rb") as stream:
            while stream.read(_copy.CHUNK):
                pass
    read_s = time.perf_counter() - started
    started = time.perf_counter()
    problems = _verify.verify(experiment, record)
    verify_s = time.perf_counter() - started
    assert not problems, problems
    emit(figure="verify_on_resume", mib=mib, files=files, verify_s=round(verify_s, 3),
         baseline_read_without_hash_s=round(read_s, 3), persist_s=round(persist_s, 3),
         verify_vs_persist=round(verify_s / persist_s, 2),
         note="files in the page cache, as right after a commit; hashing dominates")
    shutil.rmtree(experiment.path)
    shutil.rmtree(source)


if __name__ == "__main__":
    main()

"""Which scheduling priority rank 0's experiment writer needs: what a synchronous checkpoint
``report()`` takes when every core is busy with other work at normal priority (a data
loader's workers, another job's ranks on a shared node), with the writer at normal priority
(hpckit's choice) and at Linux's ``SCHED_IDLE`` (the copy and hash threads' priority).

    python benchmarks/writer_priority.py [--reports 20] [--rounds 3] [--burners 2]

Each round runs one in-process fit() per priority, in alternation, each reporting
``--reports`` small checkpoints synchronously while ``--burners`` busy processes hold the
cores. One JSON line per run: the round, the priority, and the median and slowest
``report()`` in ms; then one line per priority (``round: "all"``): the median over the rounds
of each run's median, and the slowest report of all.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def train(config: dict) -> None:
    import hpckit

    for step in range(config["reports"]):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "state"), "wb") as f:
                f.write(os.urandom(4096))
            began = time.perf_counter()
            hpckit.report({"step": step}, checkpoint=hpckit.Checkpoint.from_directory(d))
            config["ms"].append((time.perf_counter() - began) * 1000)


def one_run(priority: str, reports: int, storage: str) -> dict:
    import hpckit
    from hpckit.background import IDLE, NORMAL
    from hpckit.experiment import writer

    writer.NORMAL = IDLE if priority == "idle" else NORMAL  # the writer's, as it starts
    try:
        ms: list[float] = []
        hpckit.DataParallelTrainer(
            train, train_loop_config={"reports": reports, "ms": ms},
            run_config=hpckit.RunConfig(name=f"{priority}-{time.time_ns()}",
                                        storage_path=storage)).fit()
    finally:
        writer.NORMAL = NORMAL
    return {"benchmark": "writer_priority", "priority": priority,
            "report_ms_median": round(statistics.median(ms), 2),
            "report_ms_max": round(max(ms), 2), "reports": reports}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--reports", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--burners", type=int, default=os.cpu_count() or 2)
    args = p.parse_args()
    os.environ.setdefault("HPCKIT_TENSORBOARD", "0")
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
               for _ in range(args.burners)]
    try:
        runs: list[dict] = []
        with tempfile.TemporaryDirectory() as storage:
            for round_ in range(args.rounds):
                for priority in ("normal", "idle"):
                    runs.append({**one_run(priority, args.reports, storage), "round": round_})
                    print(json.dumps(runs[-1]), flush=True)
        for priority in ("normal", "idle"):
            mine = [r for r in runs if r["priority"] == priority]
            print(json.dumps({
                "benchmark": "writer_priority", "priority": priority, "round": "all",
                "burners": args.burners, "reports": args.reports,
                "report_ms_median": round(statistics.median(
                    r["report_ms_median"] for r in mine), 2),
                "report_ms_max": max(r["report_ms_max"] for r in mine)}), flush=True)
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()


if __name__ == "__main__":
    main()

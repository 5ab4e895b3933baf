"""What an experiment tracker costs a run's training (#66): the time from an attempt's start
to its first committed report, and to its last, for the same run with an MLflow tracker that
cannot be reached (``tracking_uri="http://127.0.0.1:9"``), with a reachable one (a local
sqlite store), and without trackers (the baseline). JSON lines, medians of interleaved
repetitions.

    python benchmarks/trackers.py [--reps 5] [--out FILE]

Each run is tests/ranks/tracked.py: ``python tracked.py`` (hpckit starts two ranks,
``DataParallelTrainer``), eight reports of a small dict, a checkpoint every third. The
attempt's start is its ``started_at`` in the manifest, each report's time its
``metrics.jsonl`` line's. The goal: the first step within 10 % of the run without trackers.
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
from pathlib import Path

from lines import emit, write_to

ROOT = Path(__file__).resolve().parent.parent
TRACKED = ROOT / "tests" / "ranks" / "tracked.py"
FORMS = ("none", "unreachable", "sqlite")


def one(folder: Path, form: str, rep: int) -> dict[str, float]:
    name = f"{form}-{rep}"
    tracker = [] if form == "none" else ["--tracker", "mlflow", "--uri",
                                          "http://127.0.0.1:9" if form == "unreachable"
                                          else f"sqlite:///{folder}/mlflow.db"]
    started = time.time()
    out = subprocess.run([sys.executable, str(TRACKED), "--storage", str(folder), "--name", name,
                          "--markers", str(folder), *tracker], capture_output=True, text=True,
                         timeout=600, env={**os.environ, "HPCKIT_TENSORBOARD": "0"})
    if out.returncode != 0:
        sys.exit(f"{form}: failed\n{out.stdout}\n{out.stderr}")
    wall = time.time() - started
    manifest = json.loads((folder / name / "manifest.json").read_text())
    began = manifest["attempts"][-1]["started_at"]
    times = [json.loads(line)["time"] for line in (folder / name / "metrics.jsonl").open()]
    return {"first_step_s": times[0] - began, "last_step_s": times[-1] - began, "wall_s": wall}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    write_to(args.out)
    found: dict[str, list[dict[str, float]]] = {form: [] for form in FORMS}
    with tempfile.TemporaryDirectory(prefix="hpckit-trackers-") as root:
        for rep in range(args.reps):
            for form in FORMS[rep % len(FORMS):] + FORMS[:rep % len(FORMS)]:
                folder = Path(root) / f"{form}-{rep}"
                folder.mkdir()
                found[form].append(one(folder, form, rep))
    base = statistics.median(r["first_step_s"] for r in found["none"])
    for form, runs in found.items():
        first = statistics.median(r["first_step_s"] for r in runs)
        emit(figure="trackers", form=form, reps=args.reps, first_step_s=round(first, 3),
             last_step_s=round(statistics.median(r["last_step_s"] for r in runs), 3),
             wall_s=round(statistics.median(r["wall_s"] for r in runs), 2),
             first_step_vs_none=round(first / base, 3) if base else None,
             goal_met=first <= base * 1.10)


if __name__ == "__main__":
    main()

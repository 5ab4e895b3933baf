"""A node lost mid-run, on the tests' three-node Slurm (tests/support/slurm_cluster.py; root only): the
time from the loss to training again, broken down, for ``python train.py`` (hpckit's driver,
which tells a lost node by its heartbeat) beside ``hpckit run`` (the baseline: it learns of
the loss when the job step ends, which for a lost node is when Slurm marks it DOWN after
``SlurmdTimeout``, 10 s here and 300 s at most sites). JSON lines, medians of interleaved
repetitions.

    python benchmarks/node_loss.py [--reps N] [--quick] [--out FILE]

Each job: 2 ranks of tests/ranks/steady.py on n1 and n2 of a three-node allocation
(``--no-kill``, n3 the spare), an epoch a second, ``FailureConfig(max_failures=2)``; n2 is
killed (its slurmd and every process on it) once 3 checkpoints are committed, then brought
back after the job. The phases, from the manifest and the metrics log:

- detection: from the kill to the end of the failed attempt as hpckit recorded it (E);
- relaunch: from E to the restart of the ranks, which is the next attempt's start as its
  manifest entry records it (A) less the ranks' start-up;
- start-up: the restarted ranks' "ready in", counted from the restart (srun, MPI, the
  experiment opened and its latest checkpoint verified);
- restore and an epoch: from A to the first report after the restart (the training function
  loads the checkpoint and trains one epoch, ``epoch_s``).

The four add up to the kill-to-training-again time.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lines import emit, write_to

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
STEADY = ROOT / "tests" / "ranks" / "steady.py"
HPCKIT = Path(sys.executable).with_name("hpckit")
ARGS = "--workers 2 --epochs 8 --epoch-seconds 1 --max-failures 2"
EPOCH_S = 1.0
KILL_AFTER = 3


def job(slurm, folder: Path, form: str) -> float:
    """Run one job of ``form`` ("driver" or "hpckit run") to its end; when n2 was killed."""
    name = form.replace(" ", "-")
    command = (f"{sys.executable} {STEADY} --storage {folder} --name {name} {ARGS}"
               if form == "driver" else
               f"{HPCKIT} run -n 2 --max-failures 2 {STEADY} --storage {folder} --name {name} "
               f"{ARGS}")
    script = folder / f"{name}.sbatch"
    script.write_text(f"#!/bin/bash\n{command}\n")
    out = slurm.run("sbatch", "--parsable", f"--chdir={folder}", f"--output={folder}/{name}.out",
                    "--nodes=3", "--ntasks-per-node=1", "--cpus-per-task=1", "--no-kill",
                    str(script), env_extra={"HPCKIT_LOCAL_DIR": str(slurm.local),
                                            "HPCKIT_TENSORBOARD": "0"})
    ident = out.stdout.strip()
    metrics = folder / name / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not metrics.exists() or len(metrics.read_text().splitlines()) < KILL_AFTER:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{form}: no {KILL_AFTER} reports in 120 s")
        time.sleep(0.05)
    killed = time.time()
    slurm.kill_node("n2")
    _wait_ended(slurm, ident)
    return killed


def _wait_ended(slurm, ident: str) -> None:
    deadline = time.monotonic() + 300
    while "JobState=COMPLETED" not in slurm.run("scontrol", "show", "job", "-o", ident).stdout:
        if time.monotonic() > deadline:
            raise RuntimeError(f"job {ident} did not complete")
        time.sleep(0.2)


def phases(folder: Path, form: str, killed: float) -> dict[str, float]:
    name = form.replace(" ", "-")
    manifest = json.loads((folder / name / "manifest.json").read_text())
    failed, again = manifest["attempts"][0], manifest["attempts"][-1]
    reports = [json.loads(line)
               for line in (folder / name / "metrics.jsonl").read_text().splitlines()]
    first = min(r["time"] for r in reports if r["time"] > killed)
    ready = float(re.findall(r"ready in ([\d.]+) s", (folder / f"{name}.out").read_text())[-1])
    found = {"training_again_s": first - killed, "startup_s": ready,
             "restore_and_epoch_s": first - again["started_at"]}
    if "ended_at" in failed:
        found["detection_s"] = failed["ended_at"] - killed
        found["relaunch_s"] = again["started_at"] - failed["ended_at"] - ready
    return found


def bring_back(slurm, node: str) -> None:
    """As tests/test_slurm_nodes.py does: marked DOWN, slurmd started, resumed."""
    slurm.run("scontrol", "update", f"NodeName={node}", "State=DOWN", "Reason=benchmark")
    slurm.start_node(node)
    for wanted in ("DOWN", "IDLE"):
        deadline = time.monotonic() + 120
        while not slurm.run("scontrol", "show", "node", "-o", node).stdout.split(
                "State=")[1].startswith(wanted):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{node} never {wanted}")
            time.sleep(0.5)
        if wanted == "DOWN":
            slurm.run("scontrol", "update", f"NodeName={node}", "State=RESUME")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="one repetition")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    write_to(args.out)
    from support import slurm_cluster
    reps = 1 if args.quick else args.reps
    root = Path(tempfile.mkdtemp(prefix="hpckit-node-loss-"))
    slurm = slurm_cluster.start(root / "slurm", ("n1", "n2", "n3"))
    found: dict[str, list[dict[str, float]]] = {"driver": [], "hpckit run": []}
    try:
        for rep in range(reps):
            for form in found:
                folder = root / f"{rep}-{form.replace(' ', '-')}"
                folder.mkdir()
                killed = job(slurm, folder, form)
                found[form].append(phases(folder, form, killed))
                bring_back(slurm, "n2")
    finally:
        slurm.stop()
        subprocess.run(["rm", "-rf", str(root)], check=False)
    for form, runs in found.items():
        emit(figure="node_loss", form=form, reps=reps, epoch_s=EPOCH_S,
             slurmd_timeout_s=10, **{k: round(statistics.median(r[k] for r in runs), 2)
                                     for k in runs[0]})


if __name__ == "__main__":
    main()

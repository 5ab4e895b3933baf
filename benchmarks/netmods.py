"""MPICH's network module under Slurm, on the tests' three-node Slurm (tests/support/slurm_cluster.py;
root only), on a loaded machine: whether ``python train.py`` in a job of three nodes starts,
trains and survives a lost node, and how long its ranks take to start, for each way of
choosing the network module (#64). JSON lines: one per run, then a summary per form.

    python benchmarks/netmods.py [--reps 10] [--forms ofi,ucx,mpiexec] [--out FILE]

The forms, each a batch script on ``--nodes=3 --ntasks-per-node=1 --no-kill``:

- ``ofi``: ``python train.py`` as the README teaches; hpckit's driver starts the ranks with
  ``srun --mpi=pmi2`` and the start-up hook chooses MPICH's OFI network module (Slurm's PMI
  server cuts UCX's long PMI requests); hpckit keeps MPI progressing after each step.
- ``ucx``: the same with ``export MPIR_CVAR_CH4_NETMOD=ucx`` in the script (the hook keeps a
  value the user set).
- ``mpiexec``: ``mpiexec -n 2 -ppn 1 python train.py`` in the allocation: MPICH's own
  launcher (hydra, which starts its proxies with srun) serves PMI, so UCX's requests are
  not cut. A lost node ends such a job (hpckit's driver is not there to replace it), so this
  form is timed without one.

Each job is tests/ranks/steady.py with ``--torch`` (TorchTrainer, DDP over Gloo), two ranks on
n1 and n2 (n3 the spare), an epoch a second, ``FailureConfig(max_failures=3)``; in ``ofi`` and
``ucx`` n2 is killed once two checkpoints are committed. Beside each job two processes spin
on the machine's two cores (a busy node). A run passes when the job completes with every
epoch committed; ``ready_s`` is the first attempt's "ready in" (from the command's start to
the first step: srun, MPI_Init, the rendezvous, the experiment opened).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
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
EPOCHS = 6
ARGS = f"--torch --workers 2 --epochs {EPOCHS} --epoch-seconds 1 --max-failures 3"
KILL_AFTER = 2
TIMEOUT_S = 240


def script(folder: Path, form: str, name: str) -> Path:
    train = f"{sys.executable} {STEADY} --storage {folder} --name {name} {ARGS}"
    lines = {"ofi": [train],
             "ucx": ["export MPIR_CVAR_CH4_NETMOD=ucx", train],
             "mpiexec": [f"{Path(sys.executable).parent / 'mpiexec'} -n 2 -ppn 1 {train}"]}[form]
    path = folder / f"{name}.sbatch"
    path.write_text("#!/bin/bash\n" + "\n".join(lines) + "\n")
    return path


def one_job(slurm, folder: Path, form: str, rep: int) -> dict[str, object]:
    name = f"{form}-{rep}"
    out = slurm.run("sbatch", "--parsable", f"--chdir={folder}", f"--output={folder}/{name}.out",
                    "--nodes=3", "--ntasks-per-node=1", "--cpus-per-task=1", "--no-kill",
                    str(script(folder, form, name)),
                    env_extra={"HPCKIT_LOCAL_DIR": str(slurm.local), "HPCKIT_TENSORBOARD": "0"})
    job = out.stdout.strip()
    metrics = folder / name / "metrics.jsonl"
    started = time.monotonic()
    lost = form != "mpiexec"
    if lost:
        while not metrics.exists() or len(metrics.read_text().splitlines()) < KILL_AFTER:
            if time.monotonic() - started > TIMEOUT_S or _state(slurm, job) not in (
                    "PENDING", "RUNNING"):
                return _failed(slurm, job, folder, name, "no checkpoint before the kill")
            time.sleep(0.1)
        slurm.kill_node("n2")
    while (state := _state(slurm, job)) in ("PENDING", "RUNNING", "COMPLETING"):
        if time.monotonic() - started > TIMEOUT_S:
            return _failed(slurm, job, folder, name, f"still {state}")
        if state == "COMPLETING" and lost:
            _bring_back(slurm, "n2")
        time.sleep(0.2)
    if lost and "n2" not in slurm.nodes:
        _bring_back(slurm, "n2")
    output = (folder / f"{name}.out").read_text()
    epochs = len(metrics.read_text().splitlines()) if metrics.exists() else 0
    ready = re.findall(r"ready in ([\d.]+) s", output)
    ok = state == "COMPLETED" and epochs == EPOCHS and "FINAL" in output
    if not ok:
        print(f"--- {name}: {state}, {epochs} epochs\n{output[-6000:]}", file=sys.stderr,
              flush=True)
    return {"ok": ok, "state": state, "epochs": epochs,
            "ready_s": float(ready[0]) if ready else None,
            "wall_s": round(time.monotonic() - started, 1)}


def _failed(slurm, job: str, folder: Path, name: str, why: str) -> dict[str, object]:
    slurm.run("scancel", job, check=False)
    tail = (folder / f"{name}.out").read_text()[-2000:] if (folder / f"{name}.out").exists() else ""
    print(f"--- {name}: {why}\n{tail}", file=sys.stderr, flush=True)
    deadline = time.monotonic() + 60
    while _state(slurm, job) in ("PENDING", "RUNNING", "COMPLETING") and time.monotonic() < deadline:
        time.sleep(0.5)
    if "n2" not in slurm.nodes:
        _bring_back(slurm, "n2")
    return {"ok": False, "state": why, "epochs": None, "ready_s": None, "wall_s": None}


def _state(slurm, job: str) -> str:
    found = re.search(r"JobState=(\S+)", slurm.run("scontrol", "show", "job", "-o", job,
                                                   check=False).stdout)
    return found.group(1) if found else "UNKNOWN"


def _bring_back(slurm, node: str) -> None:
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
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--forms", default="ofi,ucx,mpiexec")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    write_to(args.out)
    from support import slurm_cluster
    forms = args.forms.split(",")
    root = Path(tempfile.mkdtemp(prefix="hpckit-netmods-"))
    slurm = slurm_cluster.start(root / "slurm", ("n1", "n2", "n3"))
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"],
                                start_new_session=True) for _ in range(os.cpu_count() or 2)]
    found: dict[str, list[dict[str, object]]] = {form: [] for form in forms}
    try:
        for rep in range(args.reps):
            for form in forms[rep % len(forms):] + forms[:rep % len(forms)]:
                folder = root / f"{form}-{rep}"
                folder.mkdir()
                run = one_job(slurm, folder, form, rep)
                found[form].append(run)
                emit(figure="netmod_run", form=form, rep=rep, **run)
    finally:
        for burner in burners:
            os.kill(burner.pid, signal.SIGKILL)
            burner.wait()
        slurm.stop()
        subprocess.run(["rm", "-rf", str(root)], check=False)
    for form, runs in found.items():
        ready = [r["ready_s"] for r in runs if r["ok"] and r["ready_s"] is not None]
        emit(figure="netmod", form=form, runs=len(runs), passed=sum(bool(r["ok"]) for r in runs),
             lost_node=form != "mpiexec", loaded=True,
             ready_s=round(statistics.median(ready), 2) if ready else None,
             ready_max_s=round(max(ready), 2) if ready else None)


if __name__ == "__main__":
    main()

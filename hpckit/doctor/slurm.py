"""The current Slurm job's settings that decide whether a stop is graceful: the warning
signal before the time limit, and requeueing."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess

from hpckit.doctor.finding import INFO, OK, WARN, Finding
from hpckit.settings import Settings

SIGNAL = re.compile(r"^#SBATCH\s+.*--signal[= ](\S+)", re.MULTILINE)
FOREGROUND_SRUN = re.compile(r"^\s*srun\b(?![^\n]*&\s*$)", re.MULTILINE)


def job_settings(settings: Settings) -> list[Finding]:
    job = settings.slurm_job_id
    if not job:
        return [Finding("Slurm job", INFO, "not in a Slurm job", "run inside salloc, or as "
                        "srun hpckit doctor in the job script, to check its settings")]
    scontrol = shutil.which("scontrol")
    if not scontrol:
        return [Finding("Slurm job", WARN, f"job {job}, but no scontrol on PATH",
                        "load the Slurm module: hpckit requeues with scontrol")]
    fields = _fields(scontrol, str(job))
    requeue = fields.get("Requeue")
    found = [Finding("Slurm job", OK, f"job {job}, time limit {fields.get('TimeLimit', '?')}")]
    found.append(Finding("Slurm requeue", OK, "Requeue=1") if requeue == "1" else
                 Finding("Slurm requeue", WARN, f"Requeue={requeue or '?'}", "submit with "
                         "#SBATCH --requeue, so that a stop or a preemption can requeue the job"))
    found.append(_signal(scontrol, str(job), settings, fields.get("BatchFlag") == "1"))
    return found


def _fields(scontrol: str, job: str) -> dict[str, str]:
    try:
        text = subprocess.run([scontrol, "show", "job", "-o", job], capture_output=True,
                              text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return dict(token.split("=", 1) for token in text.split() if "=" in token)


def _signal(scontrol: str, job: str, settings: Settings, batch: bool) -> Finding:
    """Slurm does not report a job's --signal; the batch script says it, when there is one."""
    if not batch:
        name = settings.stop_signal.name.removeprefix("SIG")
        return Finding("Slurm signal", INFO, "an interactive allocation (no batch script)",
                       f"in the batch script: #SBATCH --signal=B:{name}@120 and exec python "
                       "train.py (slurm/multi-node.sbatch)")
    try:
        script = subprocess.run([scontrol, "write", "batch_script", job, "-"],
                                capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        script = ""
    return signal_in(script, settings.stop_signal)


def signal_in(script: str, stop: signal.Signals) -> Finding:
    """Whether the batch ``script``'s --signal reaches the ranks as ``stop``, and the fix that
    fits how it starts them: ``B:`` warns the batch process alone, which is right where it is
    the program that starts the ranks (``exec python train.py``) or passes the warning on
    (slurm/requeue.sbatch), and kills a shell that runs srun in the foreground; without
    ``B:`` Slurm warns the job step's tasks, the ranks themselves."""
    name = stop.name.removeprefix("SIG")
    foreground = bool(FOREGROUND_SRUN.search(script)) and not re.search(
        rf"^\s*trap\b[^\n]*\b(SIG)?{name}\b", script, re.MULTILINE)
    wanted = f"{name}@120" if foreground else f"B:{name}@120"
    given = SIGNAL.search(script)
    if given is None:
        return Finding("Slurm signal", WARN, "no #SBATCH --signal in the batch script",
                       f"#SBATCH --signal={wanted}: the job is then warned two minutes before "
                       "its time limit and checkpoints, instead of being killed")
    said = given.group(1)
    if said.startswith("B:") and foreground:
        return Finding("Slurm signal", WARN, f"--signal={said} warns the batch shell, which runs "
                       "srun in the foreground and dies of it", f"#SBATCH --signal={wanted} (the "
                       "ranks are warned), or trap the signal and pass it on, as "
                       "slurm/requeue.sbatch does")
    given_name = said.split("@")[0].removeprefix("B:").removeprefix("SIG")
    if given_name not in (name, str(int(stop))):
        return Finding("Slurm signal", WARN, f"--signal={said}, but hpckit stops on "
                       f"{stop.name}", f"#SBATCH --signal={wanted}, or set "
                       f"HPCKIT_STOP_SIGNAL={given_name}")
    return Finding("Slurm signal", OK, f"--signal={said}")

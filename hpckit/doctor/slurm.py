"""The current Slurm job's settings that decide whether a stop is graceful: the warning
signal before the time limit, and requeueing."""

from __future__ import annotations

import re
import shutil
import subprocess

from hpckit.doctor.finding import INFO, OK, WARN, Finding
from hpckit.settings import Settings

SIGNAL = re.compile(r"^#SBATCH\s+.*--signal[= ](\S+)", re.MULTILINE)


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
    wanted = f"B:{settings.stop_signal.name.removeprefix('SIG')}@120"
    if not batch:
        return Finding("Slurm signal", INFO, "an interactive allocation (no batch script)",
                       f"in the batch script: #SBATCH --signal={wanted}")
    try:
        script = subprocess.run([scontrol, "write", "batch_script", job, "-"],
                                capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        script = ""
    given = SIGNAL.search(script)
    if given is None:
        return Finding("Slurm signal", WARN, "no #SBATCH --signal in the batch script",
                       f"#SBATCH --signal={wanted}: the job is then warned two minutes before "
                       "its time limit and checkpoints, instead of being killed")
    name = given.group(1).split("@")[0].removeprefix("B:").removeprefix("SIG")
    if name not in (settings.stop_signal.name.removeprefix("SIG"), str(int(settings.stop_signal))):
        return Finding("Slurm signal", WARN, f"--signal={given.group(1)}, but hpckit stops on "
                       f"{settings.stop_signal.name}", f"#SBATCH --signal={wanted}, or set "
                       f"HPCKIT_STOP_SIGNAL={name}")
    return Finding("Slurm signal", OK, f"--signal={given.group(1)}")

"""Speaks PMI-1 to Slurm's PMI server (srun --mpi=pmi2) as MPICH's client does: one ``put``
request of each length in argv (in bytes, newline included, whatever the job id's length),
each printed with the server's answer (or NO ANSWER)."""

import os
import select
import sys

fd = int(os.environ["PMI_FD"])
os.write(fd, b"cmd=init pmi_version=1 pmi_subversion=1\n")
print("INIT", os.read(fd, 1024).decode().strip(), flush=True)
job_step = f"{os.environ['SLURM_JOB_ID']}.{os.environ['SLURM_STEP_ID']}"
for number, length in enumerate(int(argument) for argument in sys.argv[1:]):
    start = f"cmd=put kvsname={job_step} key=k{number} value="
    request = start + "A" * (length - len(start) - 1) + "\n"
    os.write(fd, request.encode())
    ready, _, _ = select.select([fd], [], [], 3)
    answer = os.read(fd, 1024).decode().strip() if ready else "NO ANSWER"
    print(f"PUT OF {len(request)} BYTES: {answer}", flush=True)

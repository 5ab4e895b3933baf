"""CPUs per rank under a Slurm that binds each task to its cores, as sites with task/affinity
or task/cgroup do. srun of Slurm 22.05 does not inherit the job's ``--cpus-per-task`` (srun(1):
"not automatically inherited"), and mpiexec's proxies are srun tasks too: without care, each
rank of a job that asked for several CPUs a task gets one. The tests' other Slurms do not bind
tasks (task/none) and could not see it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import HERE, HPCKIT
from support.slurm_jobs import output_of, wait

TEMPLATES = HERE.parent / "slurm"
PROBE = HERE / "ranks" / "cpus.py"


@pytest.fixture(scope="module")
def slurm_cores(tmp_path_factory: pytest.TempPathFactory):
    """A one-node Slurm of this machine's real cores, binding each task to its own."""
    from support import slurm_cluster
    absent = slurm_cluster.missing()
    if absent:
        if os.environ.get("CI"):
            pytest.fail(f"CI must test with a real Slurm, but {', '.join(absent)} is missing")
        pytest.skip(f"Slurm is not installed ({', '.join(absent)} missing)")
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: no task can be given two")
    cluster = slurm_cluster.start(tmp_path_factory.mktemp("slurm-cores"), bind_cores=True)
    yield cluster
    cluster.stop()


def submit(slurm, tmp_path: Path, script: Path, *options: str, **env: str) -> str:
    out = subprocess.run(["sbatch", "--parsable", f"--chdir={tmp_path}",
                          f"--output={tmp_path}/%x-%j.out", *options, str(script)],
                         env={**slurm.env, "PYTHON": sys.executable, **env},
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def cpus_of_ranks(tmp_path: Path, job: str) -> dict[str, set[int]]:
    output = "".join(p.read_text() for p in tmp_path.glob(f"*-{job}.out"))
    return {rank: {int(c) for c in cpus.split(",")}
            for rank, cpus in re.findall(r"^CPUS (\S+) (\S+)$", output, re.MULTILINE)}


def test_every_rank_hpckit_and_the_templates_start_has_the_jobs_cpus_per_task(tmp_path,
                                                                             slurm_cores):
    """Jobs that ask for two CPUs a task: the rank that ``hpckit run`` starts with srun across
    the allocation (as ``python train.py`` does), the rank of one-node.sbatch's srun, and the
    two ranks of mpirun.sbatch's mpiexec each may run on both."""
    both = set(sorted(os.sched_getaffinity(0))[:2])
    driver = tmp_path / "driver.sbatch"
    driver.write_text(f"#!/bin/bash\nexec {HPCKIT} run -n 1 {PROBE}\n")
    jobs = {
        "hpckit run": submit(slurm_cores, tmp_path, driver, "--ntasks=1", "--cpus-per-task=2",
                             "--time=5"),
        "one-node.sbatch": submit(slurm_cores, tmp_path, TEMPLATES / "one-node.sbatch",
                                  "--ntasks=1", "--cpus-per-task=2", "--time=5",
                                  SCRIPT=str(PROBE)),
        "mpirun.sbatch": submit(slurm_cores, tmp_path, TEMPLATES / "mpirun.sbatch",
                                "--ntasks=2", "--cpus-per-task=1", "--time=5",
                                SCRIPT=str(PROBE)),
    }
    for how, job in jobs.items():
        assert wait(slurm_cores, tmp_path, job, 180) == {job: "COMPLETED"}, output_of(tmp_path)
    ranks = {how: cpus_of_ranks(tmp_path, job) for how, job in jobs.items()}
    assert ranks["hpckit run"] == {"0": both}, (ranks, output_of(tmp_path))
    assert ranks["one-node.sbatch"] == {"0": both}, (ranks, output_of(tmp_path))
    assert ranks["mpirun.sbatch"] == {"0": both, "1": both}, (ranks, output_of(tmp_path))


def test_every_srun_of_the_templates_passes_the_jobs_cpus_per_task():
    """The templates the test above does not run: each srun line asks for the job's CPUs."""
    for template in sorted(TEMPLATES.glob("*.sbatch")):
        text = template.read_text().replace("\\\n", " ")
        for line in text.splitlines():
            if re.match(r"\s*srun\b", line):
                assert '--cpus-per-task="${SLURM_CPUS_PER_TASK:-1}"' in line, \
                    f"{template.name}: {line}"

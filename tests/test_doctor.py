"""``hpckit doctor`` alone, under mpiexec, across two nodes and under srun: every check that can
fail here is made to fail (a launcher of another MPI, a missing cache directory, storage
that two nodes do not share, srun without PMI), and says its fix."""

from __future__ import annotations

import json
import re
import signal
import stat

import pytest
from support.cluster_nodes import nodes  # noqa: F401  (the fixture)
from conftest import HERE, HPCKIT, MPIEXEC, run
from support.slurm_jobs import output_of, sbatch, wait

from hpckit.doctor import signal_in
from hpckit.settings import Settings

DOCTOR = HERE / "ranks" / "doctor.py"


def findings(output: str) -> dict[str, dict[str, str]]:
    """The JSON findings printed by rank 0 (its lines maybe prefixed "[0] "), by check."""
    text = re.sub(r"(?m)^\[\d+\] ", "", output)
    start = text.index("[\n")
    return {f["check"]: f for f in json.loads(text[start:text.rindex("]") + 1])}


def test_alone_every_check_reports_what_it_found(tmp_path):
    out = run([HPCKIT, "doctor", "--storage", str(tmp_path / "runs"), "--json"], timeout=120)
    found = findings(out.output)
    assert found["MPI library"]["status"] == "ok" and "MPICH" in found["MPI library"]["found"]
    assert found["launcher"]["status"] == "ok" and found["launcher"]["found"].endswith("MPICH")
    assert found["launch"]["found"].startswith("alone")
    assert found["torch"]["status"] == "ok" and "CPU only" in found["torch"]["found"]
    assert found["import torch"]["found"].endswith("on the slowest of 1 rank(s)")
    assert found["storage"]["status"] == "ok" and str(tmp_path / "runs") in found["storage"]["found"]
    assert not [p for p in (tmp_path / "runs").iterdir()], "the storage check leaves nothing"
    assert found["Slurm job"]["found"] == "not in a Slurm job"
    table = run([HPCKIT, "doctor", "--storage", str(tmp_path)], timeout=120).output
    assert table.splitlines()[0].split() == ["CHECK", "STATUS", "FOUND"]
    assert "fix: run inside salloc" in table


def test_under_mpiexec_rank_0_reports_for_every_rank(tmp_path):
    out = run([MPIEXEC, "-n", "3", HPCKIT, "doctor", "--storage", str(tmp_path), "--json"],
              timeout=120)
    assert out.output.count('"check": "storage"') == 1, "rank 0 alone prints"
    found = findings(out.output)
    assert found["launch"]["found"].startswith("mpiexec, 3 rank(s)")
    assert found["ranks per node"]["found"] == "3 rank(s) on 1 node(s), 3 per node"
    assert found["storage"]["found"].endswith("the same directory on all 3 rank(s)")


def table_rows(table: str) -> list[tuple[str, str]]:
    """(check, status) of each row of doctor's table; a timing's status varies, so not its."""
    found = []
    for line in table.splitlines():
        row = re.match(r"(\S.*?)\s{2,}(ok|info|warn|FAIL)\s", line)
        if row:
            found.append((row[1], "" if row[1] == "import torch" else row[2]))
    return found


def test_a_launcher_of_another_mpi_fails_with_the_fix(tmp_path):
    fake = tmp_path / "mpiexec"
    fake.write_text("#!/bin/sh\necho 'mpiexec (Open MPI) 5.0.11'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    out = run([HPCKIT, "doctor", "--storage", str(tmp_path), "--json"], timeout=120,
              env={"HPCKIT_MPIEXEC": str(fake)}, expect=1)
    launcher = findings(out.output)["launcher"]
    assert launcher["status"] == "FAIL"
    assert launcher["found"] == f"{fake}: Open MPI, but mpi4py loaded MPICH"
    assert "HPCKIT_MPIEXEC" in launcher["fix"]


def test_a_cache_directory_missing_on_the_nodes_fails_naming_a_rank(tmp_path):
    """Also docs/site.md's sample, which is this run: the checks doctor makes, in its order,
    with the statuses it gives under ``mpiexec -n 3`` with a missing cache directory."""
    missing = tmp_path / "local" / "cache"
    out = run([MPIEXEC, "-n", "3", HPCKIT, "doctor", "--storage", str(tmp_path), "--cache-dir",
               str(missing)], timeout=120, expect=1)
    assert f"{missing}: rank 0 on " in out.output and "no such directory (3 rank(s) in all)" \
        in out.output
    assert "fix: create it on every node in the job script (mkdir -p)" in out.output
    page = (HERE.parent / "docs" / "site.md").read_text()
    sample = page.split("```console\n", 1)[1].split("```", 1)[0]
    assert table_rows(sample) == table_rows(out.output), out.output
    assert len(table_rows(sample)) >= 12
    missing.mkdir(parents=True)
    run([MPIEXEC, "-n", "2", HPCKIT, "doctor", "--storage", str(tmp_path), "--cache-dir",
         str(missing)], timeout=120)


def test_storage_that_two_nodes_do_not_share_fails(nodes, tmp_path):  # noqa: F811
    node_local = nodes.mpiexec(["node-a", "node-b"], 1, DOCTOR, "--storage",
                               str(nodes.local / "runs"), "--json", expect=1)
    storage = findings(node_local.output)["storage"]
    assert storage["status"] == "FAIL"
    assert "rank 1 on node-b cannot see the file rank 0 wrote there" in storage["found"]
    shared = nodes.mpiexec(["node-a", "node-b"], 1, DOCTOR, "--storage", str(tmp_path / "runs"),
                           "--json")
    found = findings(shared.output)
    assert found["storage"]["status"] == "ok"
    assert found["ranks per node"]["found"] == "2 rank(s) on 2 node(s), 1 per node"


def test_under_srun_it_checks_the_job_and_catches_tasks_that_run_alone(tmp_path, slurm):
    out = run(["srun", "-n", "2", "--mpi=pmi2", "-t", "2", HPCKIT, "doctor", "--storage",
               str(tmp_path), "--json"], timeout=120, env=slurm.env)
    found = findings(out.output)
    assert found["launch"]["found"].startswith("srun, 2 rank(s)")
    assert found["Slurm job"]["status"] == "ok" and found["Slurm job"]["found"].startswith("job ")
    assert found["Slurm signal"]["found"] == "an interactive allocation (no batch script)"
    alone = run(["srun", "-n", "2", "--mpi=none", "-t", "2", HPCKIT, "doctor", "--storage",
                 str(tmp_path)], timeout=120, env=slurm.env, expect=None)
    assert alone.returncode != 0
    assert "srun started 2 tasks, but MPI sees a world of 1: each task runs alone" in alone.output
    assert "fix: srun --mpi=pmi2 for MPICH" in alone.output


@pytest.mark.parametrize(("directive", "step"), [
    ("#SBATCH --signal=B:USR2@120", "srun -n 1 --mpi=pmi2 {doctor}"),
    ("#SBATCH --time=5", "exec {doctor}")])
def test_in_a_batch_job_it_reads_the_signal_from_the_script(tmp_path, slurm, directive, step):
    """Its fix fits how the script starts the ranks (finding 2 of #55): srun in the foreground
    needs the warning without ``B:``, and with ``B:`` is told so; a script that execs the
    program is warned with ``B:``."""
    batch = tmp_path / "job.sbatch"
    doctor = f"{HPCKIT} doctor --storage {tmp_path} --json"
    batch.write_text(f"#!/bin/bash\n#SBATCH --requeue\n{directive}\n{step.format(doctor=doctor)}\n")
    job = sbatch(slurm, tmp_path, batch)  # not sbatch --wait, which looks every 10 s
    ended = wait(slurm, tmp_path, job, 180)
    text = output_of(tmp_path)
    found = findings(text)
    assert found["Slurm requeue"]["status"] == "ok", text
    told = found["Slurm signal"]
    assert told["status"] == "warn", text
    if step.startswith("srun"):
        assert "warns the batch shell, which runs srun in the foreground" in told["found"]
        assert told["fix"].startswith("#SBATCH --signal=USR2@120 (the ranks are warned)")
    else:
        assert told["fix"].startswith("#SBATCH --signal=B:USR2@120: the job is then warned")
    assert ended == {job: "COMPLETED"}, text


@pytest.mark.quick
@pytest.mark.parametrize(("script", "status", "fix"), [
    ("#SBATCH --signal=B:USR2@120\nexec python train.py\n", "ok", ""),
    ("#SBATCH --signal=USR2@120\nsrun --mpi=pmi2 python train.py\n", "ok", ""),
    ("#SBATCH --signal=B:USR2@120\ntrap 'kill -USR2 $step' USR2\nsrun python t.py &\nstep=$!\n",
     "ok", ""),
    ("#SBATCH --signal=B:USR2@120\nsrun python train.py\n", "warn", "--signal=USR2@120 "),
    ("#SBATCH --time=5\nexec python train.py\n", "warn", "--signal=B:USR2@120:"),
    ("#SBATCH --signal=B:USR1@120\nexec python train.py\n", "warn", "HPCKIT_STOP_SIGNAL=USR1")])
def test_the_signal_fix_fits_how_the_script_starts_the_ranks(script, status, fix):
    found = signal_in(script, signal.SIGUSR2)
    assert found.status == status and fix in found.fix, found


@pytest.mark.quick
def test_a_node_whose_slurmd_does_not_answer_is_said_to_hide_a_lost_node(monkeypatch):
    """The driver tells a lost node by asking its slurmd: one it cannot reach (here names no
    resolver knows, and no scontrol to give their addresses) is named, with the fix."""
    from hpckit import doctor

    silent = ("hpckit-test-no-such-node-1", "hpckit-test-no-such-node-2")
    monkeypatch.setattr(doctor, "hostnames", lambda nodelist: silent)
    found = doctor.lost_node_watch(Settings(slurm_nodelist="hpckit-test-no-such-node-[1-2]"))
    assert found.status == "warn" and all(name in found.found for name in silent), found
    assert "SlurmdPort" in found.fix
    alone = doctor.lost_node_watch(Settings(slurm_nodelist=None))
    assert alone.status == "info" and alone.found == "not in a job of several nodes"


def test_in_a_job_of_three_nodes_every_slurmd_answers_the_batch_node(tmp_path, slurm_nodes):
    batch = tmp_path / "job.sbatch"
    batch.write_text(f"#!/bin/bash\n{HPCKIT} doctor --storage {tmp_path} --json\n")
    job = sbatch(slurm_nodes, tmp_path, batch, "--nodes=3", "--ntasks-per-node=1")
    ended = wait(slurm_nodes, tmp_path, job, 120)
    text = output_of(tmp_path)
    watch = findings(text)["lost nodes"]
    assert watch["status"] == "ok" and "the slurmd of all 3 nodes answers from n1" in \
        watch["found"], text
    assert "hang_timeout_s" in watch["found"]
    assert ended == {job: "COMPLETED"}, text
